"""The quality bar: is the framework's tuned dense default as good as plain AdamW and a peer?

Two baselines trained on exactly the framework run's tokens, each over an η grid:

  (a) ours, plain: the same Decoder (framework/model.py), trained by a plain PyTorch
      loop: no Lightning, no parametrization (one LR, one init std, multipliers 1),
      torch.optim.AdamW with weight decay on the matrices, the recipe's warmup then
      linear decay to zero;
  (b) a peer nobody here wrote: transformers' LlamaForCausalLM (RMSNorm, RoPE, SwiGLU,
      untied head) of the recipe's width, depth and heads, its MLP sized so that its
      non-embedding parameters match ours, trained by the same loop.

Same batches in the same order (framework.data.TokenDataModule over the same litdata
chunks with the recipe's data.seed), the same number of steps, and the same held-out
tokens as the sweeps' `eval heldout` (eval/inputs.py's ValidationData: --heldout-tokens
spread over the val split). The framework's own number is read from a finished run
(--framework RUN_DIR: its evals/heldout.json, e.g. the tuned base's run of
`layerdrop tune`), so nothing here re-implements it. The bar (issue 18): the framework
within 1% of the better baseline at its best η.

    .venv/bin/python benchmarks/quality_bar.py --config sweeps/tune-cpu/tuned.yaml --data data/builtin-2k \\
        --lrs 1e-3 2e-3 4e-3 8e-3 --peer-lrs 1e-3 2e-3 4e-3 8e-3 \\
        --framework "sweeps/tune-cpu/runs/<the chosen run>,seed=0" --jobs 2 --threads 1
    .venv/bin/python benchmarks/quality_bar.py --table      # the BENCHMARKS.md table from the JSON
    .venv/bin/python benchmarks/quality_bar.py --table --framework RUN_DIR   # set (or replace) the framework's row

Writes benchmarks/results/quality_bar.json (every η's held-out loss, the model sizes,
the settings and the command).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import multiprocessing
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
import yaml

from eval.inputs import ValidationData
from framework.config import ModelConfig, ParametrizationConfig
from framework.atomic_write import write_json
from framework.data import TokenDataModule
from framework.lr_schedule import lr_factor
from framework.model import Decoder
from framework.parametrization import init_decoder_

RESULTS = Path(__file__).parent / "results" / "quality_bar.json"
BAR = 0.01  # the framework within 1% of the better baseline


# ----------------------------------------------------------------------- settings
def read_recipe(path: str) -> dict:
    """The model, data and schedule settings of a `layerdrop pretrain` recipe."""
    recipe = yaml.safe_load(Path(path).read_text()) or {}
    model, data, trainer = recipe.get("model", {}), recipe.get("data", {}), recipe.get("trainer", {})
    derived = ("logit_multiplier", "residual_multiplier")  # the parametrization's, not the plain model's
    decoder = {k: v for k, v in model.get("decoder", {}).items() if k not in derived}
    schedule = model.get("lr_schedule", {})
    steps = int(trainer.get("max_steps") or 0)
    if steps < 1:
        raise ValueError(f"{path}: trainer.max_steps={trainer.get('max_steps')!r} is invalid: the runs need a length")
    warmup = int(schedule.get("warmup_steps") or 0)
    if schedule.get("warmup_fraction"):
        warmup = max(1, round(float(schedule["warmup_fraction"]) * steps))
    return {"decoder": decoder, "seq_len": int(data.get("seq_len", 256)), "batch_size": int(data.get("batch_size", 16)),
            "data_seed": int(data.get("seed", 42)), "steps": steps, "warmup_steps": warmup,
            "decay": schedule.get("decay", "linear"), "seed": int(recipe.get("seed_everything", 0) or 0),
            "betas": tuple(model.get("parametrization", {}).get("betas", (0.9, 0.95)))}


# ------------------------------------------------------------------------- models
def ours(settings: dict) -> torch.nn.Module:
    """Our Decoder with the standard parametrization: one init std, multipliers 1."""
    config = ModelConfig(**settings["decoder"])
    decoder = Decoder(config)
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


# -------------------------------------------------------------------------- loops
def logits_of(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    if isinstance(model, Decoder):
        return model
    return lambda tokens: model(input_ids=tokens, use_cache=False).logits


def optimizer_for(model: torch.nn.Module, lr: float, weight_decay: float, betas: tuple) -> torch.optim.AdamW:
    """One LR; weight decay on the matrices (the embeddings included, as nanoGPT does),
    none on norms and biases."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=1e-8)


def train(model: torch.nn.Module, settings: dict, data_dir: str, lr: float, weight_decay: float) -> dict:
    forward = logits_of(model)
    optimizer = optimizer_for(model, lr, weight_decay, settings["betas"])
    steps = settings["steps"]
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: lr_factor(
        t, total_steps=steps, warmup_steps=settings["warmup_steps"], decay=settings["decay"]))
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
    return {"final_train_loss": sum(losses[-10:]) / len(losses[-10:]), "diverged": not math.isfinite(losses[-1]),
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


def point(kind: str, lr: float, settings: dict, intermediate: int, args: argparse.Namespace) -> dict:
    """One η of one trainer, start to end: its own process under ``--jobs``, so it sets its
    own threads and seeds and shares nothing with the others."""
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(settings["seed"])
    model = ours(settings) if kind == "plain" else llama(settings, intermediate)
    row = {"lr": lr, **train(model, settings, args.data, lr, args.weight_decay)}
    held = ValidationData(args.data, seq_len=settings["seq_len"], batch_size=args.heldout_batch_size,
                          max_tokens=args.heldout_tokens, max_batches=None,
                          model_vocab_size=settings["decoder"]["vocab_size"])
    row.update(heldout_loss(model, held) if not row["diverged"] else {"heldout_loss": math.inf})
    return row


def run_grids(grids: dict[str, list[float]], settings: dict, intermediate: int, args,
              rows: dict[tuple[str, float], dict], save: Callable[[dict], None]) -> None:
    """Every (trainer, η) point not yet in ``rows``, ``args.jobs`` at a time (spawned
    processes: a forked torch with live threads can deadlock); ``save(rows)`` after each,
    so an interrupted grid is finished later from what it wrote."""
    names = {"plain": "ours, plain AdamW", "peer": "Llama"}
    tasks = [(kind, lr) for kind, lrs in grids.items() for lr in lrs if (kind, lr) not in rows]
    if len(tasks) < sum(map(len, grids.values())):
        print(f"{sum(map(len, grids.values())) - len(tasks)} points done earlier (in {args.out}), "
              f"{len(tasks)} to train", flush=True)

    def done(kind: str, lr: float, row: dict) -> None:
        rows[kind, lr] = row
        save(rows)
        print(f"{names[kind]} lr={lr:g}: held-out loss {row['heldout_loss']:.4f} "
              f"(train {row['final_train_loss']:.4f}, {row['cpu_seconds']} CPU s)", flush=True)

    if args.jobs == 1:
        for kind, lr in tasks:
            done(kind, lr, point(kind, lr, settings, intermediate, args))
        return
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        futures = {pool.submit(point, kind, lr, settings, intermediate, args): (kind, lr) for kind, lr in tasks}
        for future in concurrent.futures.as_completed(futures):
            done(*futures[future], future.result())


def earlier_rows(out: Path, record: dict, overwrite: bool) -> dict[tuple[str, float], dict]:
    """The points an earlier run of the same settings (paths aside) wrote to ``out``
    (none with --overwrite, which replaces only a file this script wrote); a file of other
    settings is never replaced unasked, and nothing this script did not write ever is."""
    if not out.exists():
        return {}
    try:
        earlier = json.loads(out.read_text()) if out.is_file() else None
    except (ValueError, UnicodeDecodeError):
        earlier = None
    ours = isinstance(earlier, dict) and isinstance(earlier.get("settings"), dict) and \
        all(isinstance(earlier.get(kind), dict) and isinstance(earlier[kind].get("rows"), list)
            for kind in ("plain", "peer"))
    if not ours:
        raise SystemExit(f"--out {str(out)!r} exists and is not this script's JSON: it is never replaced "
                         "(even with --overwrite); choose another --out")
    if overwrite:
        return {}
    paths = ("config", "data")  # where the files are on this machine: a grid may be finished on another
    if {k: v for k, v in earlier["settings"].items() if k not in paths} != \
            {k: v for k, v in record.items() if k not in paths}:
        raise SystemExit(f"--out {str(out)!r} holds results of other settings: pass --overwrite to replace it, "
                         "or another --out")
    return {(kind, float(row["lr"])): row for kind in ("plain", "peer") for row in earlier[kind]["rows"]}


def best(rows: list[dict]) -> dict | None:
    finite = [r for r in rows if math.isfinite(r["heldout_loss"])]
    return min(finite, key=lambda r: r["heldout_loss"]) if finite else None


# ------------------------------------------------------------------------- output
def framework_result(run_dir: str | None) -> dict | None:
    if not run_dir:
        return None
    report = Path(run_dir) / "evals" / "heldout.json"
    if not report.is_file():
        raise ValueError(f"--framework {run_dir!r} is invalid: it has no evals/heldout.json (a finished sweep run)")
    recipe = Path(run_dir) / "recipe.yaml"
    lr = (yaml.safe_load(recipe.read_text()) or {}).get("model", {}).get("parametrization", {}).get("lr") \
        if recipe.is_file() else None
    held = json.loads(report.read_text())
    return {"run": Path(run_dir).name, "lr": lr, "heldout_loss": float(held["loss"]), "heldout_tokens": held["tokens"]}


def verdict(result: dict) -> str | None:
    framework = result.get("framework")
    bests = [b for b in (result["plain"]["best"], result["peer"]["best"]) if b]
    if not framework or not bests:
        return None
    if framework.get("heldout_tokens") != result.get("heldout_tokens"):
        return (f"not comparable: the framework's held-out loss is on {framework.get('heldout_tokens')} tokens, the "
                f"baselines' on {result.get('heldout_tokens')} (run its eval heldout with --max-tokens "
                f"{result.get('heldout_tokens')})")
    bar = min(b["heldout_loss"] for b in bests)
    gap = framework["heldout_loss"] / bar - 1
    return (f"the framework's {framework['heldout_loss']:.4f} is {100 * gap:+.2f}% against the better baseline's "
            f"{bar:.4f}: {'within' if gap <= BAR else 'outside'} the {100 * BAR:.0f}% bar")


def table(result: dict) -> str:
    """The BENCHMARKS.md table: held-out loss per η for each trainer, best marked."""
    etas = " | ".join(f"η = {lr:g}" for lr in result["lrs_all"])
    lines = [f"| trainer | non-embedding params | {etas} | best |",
             "|---|---|" + "---|" * len(result["lrs_all"]) + "---|"]
    for key, label in (("plain", "ours, plain AdamW loop"), ("peer", "LlamaForCausalLM (transformers), AdamW")):
        part = result[key]
        by_lr = {r["lr"]: r["heldout_loss"] for r in part["rows"]}
        cells = [("diverged" if by_lr[lr] == math.inf else f"{by_lr[lr]:.4f}") if lr in by_lr else "" for lr in
                 result["lrs_all"]]
        top = part["best"]
        lines.append(f"| {label} | {part['non_embedding_params']:,} | " + " | ".join(cells)
                     + f" | {top['heldout_loss']:.4f} (η {top['lr']:g}) |" if top else " | - |")
    framework = result.get("framework")
    if framework:
        lines.append(f"| layerdrop (tuned, `{framework['run']}`) | {result['plain']['non_embedding_params']:,} | "
                     + " | ".join("" for _ in result["lrs_all"]) + f" | {framework['heldout_loss']:.4f} |")
    lines += ["", f"Held-out loss on {result['heldout_tokens']:,} tokens, {result['settings']['steps']:,} steps of "
              f"{result['settings']['batch_size']} × {result['settings']['seq_len']} tokens, the same batches for "
              f"every row. `{result['command']}`"]
    if result.get("partial"):
        lines += ["", "Partial: the grid is not finished (run the same command again to finish it)."]
    line = verdict(result)
    if line:
        lines += ["", f"Verdict: {line}."]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="the recipe whose model, data order and schedule the baselines copy "
                                         "(e.g. the tuned base: <tune folder>/tuned.yaml)")
    parser.add_argument("--data", help="the prepared data folder the framework run trained on")
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-3, 2e-3, 4e-3, 8e-3],
                        help="η grid of the plain AdamW loop on our model")
    parser.add_argument("--peer-lrs", type=float, nargs="+", default=[1e-3, 2e-3, 4e-3, 8e-3],
                        help="η grid of the Llama peer")
    parser.add_argument("--weight-decay", type=float, default=0.1, help="AdamW λ on the matrices (default 0.1)")
    parser.add_argument("--steps", type=int, default=None, help="override the recipe's max_steps (tiny checks)")
    parser.add_argument("--heldout-tokens", type=int, default=131072,
                        help="held-out tokens, spread over the val split (default 131072, as the sweeps' heldout)")
    parser.add_argument("--heldout-batch-size", type=int, default=16, help="as `eval heldout`'s default (16)")
    parser.add_argument("--framework", metavar="RUN_DIR", help="a finished sweep run of the framework at this "
                                                               "setting: its evals/heldout.json is the framework's row")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (of each job)")
    parser.add_argument("--jobs", type=int, default=1, help="η points trained at a time, each in its own process")
    parser.add_argument("--out", default=str(RESULTS), help=f"the JSON (default {RESULTS})")
    parser.add_argument("--overwrite", action="store_true",
                        help="start the grid afresh even where --out holds points of the same settings, or replace "
                             "this script's JSON of other settings (never a file it did not write)")
    parser.add_argument("--table", action="store_true", help="print the table of --out's JSON and exit")
    args = parser.parse_args(argv)
    if not args.table and not (args.config and args.data):
        parser.error("--config and --data are required (or --table to print the table of an earlier run)")
    for name in ("steps", "heldout_tokens", "heldout_batch_size", "threads", "jobs"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')}={value} is invalid: must be >= 1")
    if any(lr <= 0 for lr in [*args.lrs, *args.peer_lrs]):
        parser.error("--lrs and --peer-lrs are invalid: every η must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table:
        if not Path(args.out).is_file():
            print(f"error: --out {args.out!r} does not exist: run the grid first (--config, --data)", file=sys.stderr)
            return 2
        result = json.loads(Path(args.out).read_text())
        if args.framework:  # the framework's run set beside baselines trained before it finished
            result["framework"] = framework_result(args.framework)
            result["verdict"] = verdict(result)
            write_json(args.out, result)
        print(table(result))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = read_recipe(args.config)
    if args.steps:
        settings["steps"] = args.steps
    framework = framework_result(args.framework)  # a bad folder fails before hours of training
    ours_params = non_embedding(ours(settings))
    intermediate = matched_intermediate(settings, ours_params)
    peer_params = non_embedding(llama(settings, intermediate))
    print(f"ours: {ours_params:,} non-embedding parameters; Llama with intermediate_size {intermediate}: "
          f"{peer_params:,} ({100 * (peer_params / ours_params - 1):+.2f}%)", flush=True)
    record = json.loads(json.dumps({**settings, "betas": list(settings["betas"]), "weight_decay": args.weight_decay,
                                    "config": args.config, "data": args.data, "heldout_tokens": args.heldout_tokens,
                                    "heldout_batch_size": args.heldout_batch_size}, default=str))
    out = Path(args.out)
    rows = earlier_rows(out, record, args.overwrite)
    grids = {"plain": args.lrs, "peer": args.peer_lrs}
    command = shlex.join(["benchmarks/quality_bar.py", *(sys.argv[1:] if argv is None else argv)])

    def result_of(rows: dict[tuple[str, float], dict]) -> dict:
        parts = {kind: [rows[kind, lr] for lr in sorted({lr for k, lr in rows if k == kind})] for kind in grids}
        measured = [r.get("heldout_tokens") for part in parts.values() for r in part if r.get("heldout_tokens")]
        result = {
            "settings": record,
            "heldout_tokens": measured[0] if measured else None,
            "lrs_all": sorted({lr for _, lr in rows}),
            "plain": {"non_embedding_params": ours_params, "rows": parts["plain"], "best": best(parts["plain"])},
            "peer": {"model": "transformers.LlamaForCausalLM", "intermediate_size": intermediate,
                     "non_embedding_params": peer_params, "rows": parts["peer"], "best": best(parts["peer"])},
            "framework": framework,
            "partial": any((kind, lr) not in rows for kind, lrs in grids.items() for lr in lrs),
            "command": command,
        }
        result["verdict"] = verdict(result)
        return result

    out.parent.mkdir(parents=True, exist_ok=True)
    run_grids(grids, settings, intermediate, args, rows, lambda rows: write_json(out, result_of(rows)))
    result = result_of(rows)
    write_json(out, result)
    print(table(result))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
