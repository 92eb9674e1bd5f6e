"""The quality bar's baselines (benchmarks/quality_bar.py): the models, their AdamW and one plain
training loop, with no Lightning and no parametrization.

Weight decay comes in two modes:

  framework   what the framework's own dense run does (framework/training/parametrization.py):
              decoupled AdamW decay on the transformer blocks' matrices only (ours: the
              parametrization's "hidden" group, blocks.<i>.{attn.qkv,attn.proj,ffn.up,ffn.down}.weight;
              Llama: model.layers.<i>.{self_attn.{q,k,v,o}_proj,mlp.{gate,up,down}_proj}.weight), never
              embeddings, head, norms or biases, with λ = 1/(η·τ_EMA·steps) from the framework's own
              ``weight_decay`` (B/D = 1/steps), so η·λ = 1/(τ_EMA·steps) is the framework's
              η_hidden·λ at any width (its hidden LR is η/m_d; at m_d = 1 the two are the same η);
  a number    the old baseline: that λ on every matrix, embedding and head included (as nanoGPT).
"""

from __future__ import annotations

import argparse
import math
import re
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
import yaml

from eval.inputs import ValidationData
from framework.config import ModelConfig, ParametrizationConfig
from framework.model.decoder import Decoder
from framework.training.data import TokenDataModule
from framework.training.lr_schedule import lr_factor
from framework.training.parametrization import HIDDEN, groups_of, init_decoder_, weight_decay

FRAMEWORK = "framework"
LLAMA_BLOCK_MATRIX = re.compile(r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)\.weight")


# ----------------------------------------------------------------------- settings
def read_recipe(path: str) -> dict:
    """The model, data, schedule and weight-decay settings of a `layerdrop pretrain` recipe."""
    recipe = yaml.safe_load(Path(path).read_text()) or {}
    model, data, trainer = recipe.get("model", {}), recipe.get("data", {}), recipe.get("trainer", {})
    derived = ("logit_multiplier", "residual_multiplier")  # the parametrization's, not the plain model's
    decoder = {k: v for k, v in model.get("decoder", {}).items() if k not in derived}
    schedule, parametrization = model.get("lr_schedule", {}), model.get("parametrization", {})
    steps = int(trainer.get("max_steps") or 0)
    if steps < 1:
        raise ValueError(f"{path}: trainer.max_steps={trainer.get('max_steps')!r} is invalid: the runs need a length")
    warmup = int(schedule.get("warmup_steps") or 0)
    if schedule.get("warmup_fraction"):
        warmup = max(1, round(float(schedule["warmup_fraction"]) * steps))
    defaults = ParametrizationConfig()
    return {"decoder": decoder, "seq_len": int(data.get("seq_len", 256)), "batch_size": int(data.get("batch_size", 16)),
            "data_seed": int(data.get("seed", 42)), "steps": steps, "warmup_steps": warmup,
            "decay": schedule.get("decay", "linear"), "min_lr_ratio": float(schedule.get("min_lr_ratio", 0.0)),
            "seed": int(recipe.get("seed_everything", 0) or 0),
            "betas": tuple(parametrization.get("betas", defaults.betas)),
            "eps": float(parametrization.get("eps", defaults.eps)),
            "tau_ema": float(parametrization.get("tau_ema", defaults.tau_ema))}


def weight_decay_mode(text: str) -> str | float:
    """``framework`` or a λ >= 0 (argparse's type: a bad value is its one-line error)."""
    if text == FRAMEWORK:
        return FRAMEWORK
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected 'framework' or a number >= 0") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: a weight decay must be a finite number >= 0")
    return value


def framework_lambda(lr: float, settings: dict) -> float:
    """The framework's λ for a group trained at ``lr``: 1/(lr·τ_EMA·steps)."""
    return weight_decay(lr, settings["tau_ema"], batch_tokens=1.0, total_tokens=float(settings["steps"]))


# ------------------------------------------------------------------------- models
def ours(settings: dict) -> torch.nn.Module:
    """Our Decoder with the standard parametrization: one init std, multipliers 1."""
    decoder = Decoder(ModelConfig(**settings["decoder"]))
    init_decoder_(decoder, ParametrizationConfig(kind="standard"))
    return decoder


def llama(settings: dict, intermediate_size: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    d = settings["decoder"]
    config = LlamaConfig(vocab_size=d["vocab_size"], hidden_size=d["d_model"], intermediate_size=intermediate_size,
                         num_hidden_layers=d["n_layers"], num_attention_heads=d["n_heads"],
                         num_key_value_heads=d["n_heads"], max_position_embeddings=settings["seq_len"],
                         tie_word_embeddings=False, initializer_range=float(d.get("init_std", 0.02)),
                         attention_bias=False, mlp_bias=False)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def non_embedding(model: torch.nn.Module) -> int:
    """Parameters outside the embedding and unembedding (what TPP counts)."""
    embeddings = ("embed.", "head.", "lm_head.", "model.embed_tokens.")  # ours; transformers' Llama
    return sum(p.numel() for name, p in model.named_parameters() if not name.startswith(embeddings))


def matched_intermediate(settings: dict, target: int) -> int:
    """The Llama MLP width whose non-embedding parameter count is closest to ``target``
    (4d² attention + 3·d·I MLP + 2d norms per block, + d final norm)."""
    d, layers = settings["decoder"]["d_model"], settings["decoder"]["n_layers"]
    per_block = (target - d) / layers
    return max(1, round((per_block - 4 * d * d - 2 * d) / (3 * d)))


def is_block_matrix(model: torch.nn.Module, name: str) -> bool:
    """A transformer block's weight matrix: what the framework decays."""
    if isinstance(model, Decoder):
        return groups_of(model)[name] == HIDDEN
    return LLAMA_BLOCK_MATRIX.fullmatch(name) is not None


# -------------------------------------------------------------------------- loops
def logits_of(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    if isinstance(model, Decoder):
        return model
    return lambda tokens: model(input_ids=tokens, use_cache=False).logits


def optimizer_for(model: torch.nn.Module, lr: float, mode: str | float, settings: dict) -> torch.optim.AdamW:
    """One LR and ε for every tensor; λ per ``mode`` (module docstring) on the decayed group, 0 on the rest."""
    named = list(model.named_parameters())
    if mode == FRAMEWORK:
        decayed = [is_block_matrix(model, n) for n, _ in named]
        name, lam = "block matrices", framework_lambda(lr, settings)
    else:
        decayed, name, lam = [p.dim() >= 2 for _, p in named], "matrices", float(mode)
    groups = [{"name": name, "params": [p for (_, p), d in zip(named, decayed) if d], "weight_decay": lam},
              {"name": "rest", "params": [p for (_, p), d in zip(named, decayed) if not d], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=settings["betas"], eps=settings["eps"])


def train(model: torch.nn.Module, settings: dict, data_dir: str, lr: float, mode: str | float) -> dict:
    forward = logits_of(model)
    optimizer = optimizer_for(model, lr, mode, settings)
    steps = settings["steps"]
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: lr_factor(
        t, total_steps=steps, warmup_steps=settings["warmup_steps"], decay=settings["decay"],
        min_lr_ratio=settings["min_lr_ratio"]))
    data = TokenDataModule(data_dir, seq_len=settings["seq_len"], batch_size=settings["batch_size"],
                           seed=settings["data_seed"])
    data.setup()
    model.train()
    loader = data.train_dataloader()
    losses, step, start = [], 0, time.process_time()
    while step < steps:  # one loader over epochs, as the Lightning loop: litdata reshuffles each one
        for inputs, targets in loader:
            logits = forward(inputs)
            loss = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            step += 1
            if step == steps:
                break
    return {"lambda": optimizer.param_groups[0]["weight_decay"],
            "final_train_loss": sum(losses[-10:]) / len(losses[-10:]), "diverged": not math.isfinite(losses[-1]),
            "cpu_seconds": round(time.process_time() - start, 1)}


@torch.inference_mode()
def heldout_loss(model: torch.nn.Module, data: ValidationData) -> dict:
    """Token-weighted mean cross-entropy over the held-out batches (eval heldout's "loss")."""
    forward = logits_of(model)
    model.eval()
    total, tokens = 0.0, 0
    for inputs, targets in data:
        logits = forward(inputs)
        total += float(F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), reduction="sum"))
        tokens += targets.numel()
    return {"heldout_loss": total / tokens, "heldout_tokens": tokens}


def point(kind: str, lr: float, mode: str | float, seed: int, settings: dict, intermediate: int,
          args: argparse.Namespace) -> dict:
    """One (trainer, η, weight decay, seed) start to end: its own process under ``--jobs``,
    so it sets its own threads and seeds and shares nothing with the others. The seed sets
    the init; the data order is the recipe's data.seed for every point."""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(seed)
    model = ours(settings) if kind == "plain" else llama(settings, intermediate)
    row = {"lr": lr, "weight_decay": mode, "seed": seed, **train(model, settings, args.data, lr, mode)}
    held = ValidationData(args.data, seq_len=settings["seq_len"], batch_size=args.heldout_batch_size,
                          max_tokens=args.heldout_tokens, max_batches=None,
                          model_vocab_size=settings["decoder"]["vocab_size"])
    row.update(heldout_loss(model, held) if not row["diverged"] else {"heldout_loss": math.inf})
    return row
