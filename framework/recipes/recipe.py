"""`layerdrop recipe`: a pretraining recipe computed from what a user knows.

    layerdrop recipe --base recipes/base.yaml --size 1.8B --tpp 20 --devices 8 --nodes 2 \\
                     --memory 141GB --p-max 0.6 --out recipes/1.8b.yaml

Given a size (a Table A.1 name, or --d-model/--n-layers/--heads), a token budget
(--tpp or --tokens), the devices (--devices per node, --nodes, --memory per device),
the layer-dropout choice and the base recipe, it writes a recipe for `layerdrop
pretrain` in which every derived number carries a comment saying how it was derived.
The target is of the base's family (``model.decoder.family``) with its shape-free fields
(vocabulary, context, RoPE, tying); a Llama's key/value heads and FFN width are
--kv-heads/--ffn-hidden or the base's grouping and FFN width per d_model.

**The base recipe** is the small run whose hyperparameters were tuned: its model is
the parametrization's base (d_model = d_base, n_layers = n_layers_base), and what it
ran defines the base quantities of Table A.2: B_base (its global batch in sequences),
D_base = max_steps·B_base·S (its tokens), N_base (its parameters), TPP_base =
D_base/N_base, η, ε, σ and τ_EMA,base. Everything the rules do not derive (data,
validation and checkpoint cadence, warmup, precision, peak FLOPs) is copied from it.

**Table A.2's rules** for a model of N parameters trained on D tokens:

    m_D   = D / D_base                            data multiplier
    B     = B_base · m_D^0.4                      rounded to a whole number of sequences per device
    steps = ceil(D / (B · S))
    τ_EMA = τ_EMA,base · (TPP / TPP_base)^-0.5    (4 significant digits)
    m_d = d/d_base, m_L = L/L_base                hidden LR η/m_d, ε/(m_d·m_L) in blocks, ε/m_d outside,
                                                  λ = B/(η_hidden·τ_EMA·D) = 1/(η_hidden·τ_EMA·steps)

η, ε and the multipliers are applied by the run itself (framework/training/parametrization.py)
from the base values the recipe carries; the recipe's comments show what they become.

**The memory model** (framework/recipes/device_memory.py: state, working memory, activations
and one loss chunk per device; 90% of the device's memory is usable, the rest going
to the CUDA context, communication buffers and fragmentation) prices every strategy
the registry proposes on this layout (framework/strategies: an entry's ``footprint``).
Strategy and micro-batch: the largest micro-batch that divides the per-device share
of B and fits, trying the strategies in the registry's ``recipe_preference`` order
(today: ddp, then sharded: hsdp across nodes, then fsdp over every device), first
without activation checkpointing (which costs a third more compute), then with it; on
equal micro-batches the earlier strategy (less communication) wins.
"""

from __future__ import annotations

import argparse
import copy
import math
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from framework.command_parser import CommandParser
from framework.recipes.commented_yaml import commented_yaml
from framework.config import PAPER_SIZES, EarlyExitLossConfig, LayerDropoutConfig, ModelConfig, ParametrizationConfig
from framework.recipes.device_memory import ModelSizes, device_memory
from framework.recipes.recipe_inputs import (EVIDENCE, BaseRun, RecipeError, byte_size, layer_dropout_config, model_config,
                                            read_base, token_count)
from framework.early_exit_loss import check_exits, mean_exit_heads
from framework.flops import expected_training_flops_per_token
from framework.files.atomic_write import write_text
from framework.files.output_path import file_problem
from framework.training.parametrization import (
    EMBEDDING,
    HIDDEN,
    optimizer_hyperparameters,
    transfer_batch_size,
    transfer_tau_ema,
    width_depth_multipliers,
)
from framework.schedules import mean_dropout
from framework.strategies import STRATEGIES, NamedStrategy

PROG = "layerdrop recipe"
HEADROOM = 0.9


# ---------------------------------------------------------------------- the memory model


@dataclass(frozen=True)
class MemoryPlan:
    """The strategy, micro-batch and checkpointing that fit, and the memory they need."""

    strategy: NamedStrategy
    micro_batch: int
    checkpointing: bool
    memory: dict[str, float]


def fit_strategy(sizes: ModelSizes, *, per_device: int, devices: int, nodes: int, usable: float, seq_len: int,
                 loss_chunk_tokens: int, mixed: bool) -> MemoryPlan:
    """The strategy, micro-batch and checkpointing that fit (module docstring's order)."""
    proposed = sorted((entry for entry in STRATEGIES.values()
                       if entry.recipe_preference is not None and entry.footprint(devices, nodes) is not None),
                      key=lambda entry: entry.recipe_preference)

    def memory(entry: NamedStrategy, micro: int, checkpointing: bool) -> dict[str, float]:
        return device_memory(sizes, entry.footprint(devices, nodes), micro_batch=micro, seq_len=seq_len,
                             checkpointing=checkpointing, loss_chunk_tokens=loss_chunk_tokens, mixed=mixed)

    divisors = [m for m in range(per_device, 0, -1) if per_device % m == 0]
    for checkpointing in (False, True):
        best = None
        for entry in proposed:
            for micro in divisors:
                needed = memory(entry, micro, checkpointing)
                if sum(needed.values()) <= usable:
                    if best is None or micro > best.micro_batch:
                        best = MemoryPlan(entry, micro, checkpointing, needed)
                    break
        if best is not None:
            return best
    least = min(sum(memory(entry, 1, True).values()) for entry in proposed)
    raise RecipeError(f"one sequence per device, fully sharded with activation checkpointing, needs "
                      f"{least / 1e9:.1f} GB of the {usable / 1e9:.1f} GB usable; add devices or nodes")


# -------------------------------------------------------------------------- derivation


@dataclass(frozen=True)
class Recipe:
    """The YAML's values and, per dotted key, how each derived one was derived."""

    values: dict[str, Any]
    comments: dict[str, str]
    header: list[str]


@dataclass(frozen=True)
class Derivation:
    """Every number Table A.2's rules and the memory model derive for one command, in the
    order ``derive`` computes them (the recipe's values, comments and header read them)."""

    args: argparse.Namespace
    base: BaseRun
    model: ModelConfig
    origin: str  # how the shape was named: "Table A.1's 1.8B" or "given"
    dropout: LayerDropoutConfig
    usable: float  # bytes per device the memory model may fill
    sizes: ModelSizes
    tokens: float
    rule: float  # B = B_base · m_D^0.4 before rounding
    per_device: int  # sequences per device per optimizer step
    steps: int
    tau: float
    pcfg: ParametrizationConfig
    p_bar: float  # mean layer dropout over the run
    exit_heads: float  # mean early-exit heads per step
    plan: MemoryPlan

    @property
    def batch(self) -> int:
        return self.per_device * self.args.devices * self.args.nodes

    @property
    def tpp(self) -> float:
        return self.tokens / self.sizes.parameters

    @property
    def name(self) -> str:
        args = self.args
        return args.name or (Path(args.out).stem if args.out else (args.size or "recipe").lower())


def derive(args: argparse.Namespace) -> Recipe:
    derivation = derive_numbers(args)
    return Recipe(recipe_values(derivation), recipe_comments(derivation), recipe_header(derivation))


def derive_numbers(args: argparse.Namespace) -> Derivation:
    """Table A.2's rules, then the memory model (every bad value refused on the way)."""
    base = read_base(args.base)
    model, origin = model_config(args, base.model)
    recipe = base.recipe
    dropout = layer_dropout_config(args, recipe["model"].get("layer_dropout", {}))
    check_layout_and_budget(args)
    usable = HEADROOM * byte_size(args.memory)
    sizes = ModelSizes.of(model)
    tokens = args.tpp * sizes.parameters if args.tpp is not None else token_count(args.tokens)
    rule = transfer_batch_size(base.batch_size, tokens / base.tokens)
    per_device = max(1, round(rule / (args.devices * args.nodes)))
    steps = math.ceil(tokens / (per_device * args.devices * args.nodes * base.seq_len))
    tau = float(f"{transfer_tau_ema(base.parametrization.tau_ema, tokens / sizes.parameters, base.tpp):.4g}")
    pcfg = ParametrizationConfig(**{**recipe["model"]["parametrization"], "tau_ema": tau})
    exits = EarlyExitLossConfig(**recipe["model"].get("early_exit_loss", {}))  # the base's, at the new depth:
    check_exits(exits, model.n_layers)
    try:
        plan = fit_strategy(sizes, per_device=per_device, devices=args.devices, nodes=args.nodes, usable=usable,
                            seq_len=base.seq_len, loss_chunk_tokens=recipe["model"].get("loss_chunk_tokens", 4096),
                            mixed="bf16" in str(recipe["trainer"].get("precision", "")))
    except RecipeError as err:
        raise RecipeError(f"--memory={args.memory!r} is invalid: {err}") from None
    return Derivation(args, base, model, origin, dropout, usable, sizes, tokens, rule, per_device, steps, tau, pcfg,
                      mean_dropout(dropout, model.n_layers, steps), mean_exit_heads(exits, model.n_layers, steps), plan)


def check_layout_and_budget(args: argparse.Namespace) -> None:
    for name in ("devices", "nodes"):
        if getattr(args, name) < 1:
            raise RecipeError(f"--{name}={getattr(args, name)} is invalid: must be >= 1")
    if (args.tpp is None) == (args.tokens is None):
        raise RecipeError("--tpp and --tokens are invalid together or both missing: give one token budget")
    if args.tpp is not None and not args.tpp > 0:
        raise RecipeError(f"--tpp={args.tpp} is invalid: must be > 0")


def recipe_values(d: Derivation) -> dict[str, Any]:
    """The recipe's derived values, by dotted key."""
    args, plan = d.args, d.plan
    return {
        "trainer.devices": args.devices, "trainer.num_nodes": args.nodes, "trainer.strategy": plan.strategy.name,
        "trainer.max_steps": d.steps, "trainer.accumulate_grad_batches": d.per_device // plan.micro_batch,
        "trainer.default_root_dir": f"runs/{d.name}", "data.batch_size": plan.micro_batch,
        "model.parametrization.tau_ema": d.tau, "model.activation_checkpointing": plan.checkpointing,
        **{f"model.decoder.{k}": getattr(d.model, k) for k in shape_comments(args, d.base, d.origin)},
        **{f"model.layer_dropout.{k}": (list(v) if isinstance(v, tuple) else v)
           for k, v in vars(d.dropout).items()},
    }


def recipe_comments(d: Derivation) -> dict[str, str]:
    """How each derived value was derived, by dotted key."""
    args, base, model, plan, pcfg = d.args, d.base, d.model, d.plan, d.pcfg
    m_d, m_l = width_depth_multipliers(pcfg, model.d_model, model.n_layers)
    hyper = optimizer_hyperparameters(pcfg, model, total_tokens=float(d.steps), batch_tokens=1.0)
    sharding = plan.strategy.describe(args.devices, args.nodes)
    return {
        "trainer.devices": "given (per node)", "trainer.num_nodes": "given",
        "trainer.strategy": f"{sharding}: the first that fits micro-batch {plan.micro_batch} (memory model above)",
        "trainer.max_steps": f"ceil(D / (B·S)) = ceil({d.tokens:,.0f} / ({d.batch}·{base.seq_len}))",
        "trainer.accumulate_grad_batches": f"B/(devices·nodes)/micro-batch = {d.per_device}/{plan.micro_batch}",
        "trainer.default_root_dir": "runs/<name>",
        "data.batch_size": f"micro-batch per device: the largest divisor of B/(devices·nodes) = {d.per_device} "
                           "that fits",
        "model.parametrization.tau_ema": f"τ_base·(TPP/TPP_base)^-0.5 = {base.parametrization.tau_ema:g}·"
                                         f"({d.tpp:.4g}/{base.tpp:.6g})^-0.5; λ = 1/(η_hidden·τ·steps) = "
                                         f"{hyper[HIDDEN]['weight_decay']:.4g} at run time",
        "model.parametrization.d_base": f"the base's width: m_d = {model.d_model}/{pcfg.d_base} = {m_d:.4g}",
        "model.parametrization.n_layers_base": f"the base's depth: m_L = {model.n_layers}/{pcfg.n_layers_base} "
                                               f"= {m_l:.4g}",
        "model.parametrization.lr": f"η_base: hidden LR η/m_d = {hyper[HIDDEN]['lr']:.4g}, others η",
        "model.parametrization.eps": f"ε_base: blocks ε/(m_d·m_L) = {hyper[HIDDEN]['eps']:.4g}, "
                                     f"(un)embedding ε/m_d = {hyper[EMBEDDING]['eps']:.4g}",
        "model.activation_checkpointing": "needed to fit" if plan.checkpointing else "not needed to fit",
        "model.layer_dropout.p_max": f"P̄ = {d.p_bar:.4g}: {100 * d.p_bar:.4g}% of the blocks' training FLOPs saved",
        **{f"model.decoder.{k}": comment for k, comment in shape_comments(args, base, d.origin).items()},
    }


def recipe_header(d: Derivation) -> list[str]:
    """The recipe's leading comment: the target, the command, and each rule with its numbers."""
    args, base, model, plan, seq, n = d.args, d.base, d.model, d.plan, d.base.seq_len, d.sizes.parameters
    dense = expected_training_flops_per_token(model, seq)
    per_token = expected_training_flops_per_token(model, seq, mean_dropout=d.p_bar, exit_heads=d.exit_heads)
    budget = f"{args.tpp:g} · N" if args.tpp is not None else "given"
    memory = " + ".join(f"{part} {value / 1e9:.1f}" for part, value in plan.memory.items())
    kv_heads = f" ({model.n_kv_heads} key/value)" if model.n_kv_heads != model.n_heads else ""
    ffn = f"{model.ffn_mult}·d" if model.ffn_hidden is None else f"{model.ffn_hidden}"
    return [
        f"{d.name}: a decoder of {n:,} parameters (d = {model.d_model}, L = {model.n_layers}, {model.n_heads} heads "
        f"of {model.head_dim}{kv_heads}, FFN {ffn}, vocabulary {model.vocab_size:,})",
        f"trained on {d.tokens:,.0f} tokens ({d.tpp:.4g} per parameter), transferred from {args.base} by Table A.2's",
        "rules. Written by `layerdrop recipe` (framework/recipes/recipe.py): change the command, not this file.",
        "", f"  {canonical_command(args)}", "",
        f"The base run: N_base = {base.parameters:,} parameters, B_base = {base.batch_size} sequences of {seq} "
        f"tokens,", f"  D_base = {base.steps:,} steps · {base.batch_size} · {seq} = {base.tokens:,} tokens "
        f"(TPP_base = {base.tpp:.6g}).",
        "This run:",
        f"  N     = {n:,} parameters",
        f"  D     = {budget} = {d.tokens:,.0f} tokens;  m_D = D / D_base = {d.tokens / base.tokens:.4g}",
        f"  B     = B_base · m_D^0.4 = {d.rule:.1f} sequences -> {d.batch} = {args.nodes} node(s) × {args.devices} "
        f"devices × {d.per_device} ({100 * (d.batch / d.rule - 1):+.1f}%)",
        f"  steps = ceil(D / (B · S)) = {d.steps:,}",
        f"  FLOPs = D · (blocks · (1 - P̄) + head · (1 + Ē)) = {d.tokens:.4g} · ({dense.blocks:.4g} · "
        f"{1 - d.p_bar:.4g} + {dense.head:.4g} · {1 + d.exit_heads:.4g}) = {d.tokens * per_token.total:.4g}",
        f"          (training FLOPs: P̄ = {d.p_bar:.4g} layer dropout, Ē = {d.exit_heads:.4g} early-exit heads a step)",
        f"  memory per device (GB) = {memory} = {sum(plan.memory.values()) / 1e9:.1f} of {d.usable / 1e9:.1f} "
        f"usable ({plan.strategy.name}, micro-batch {plan.micro_batch}"
        f"{', activation checkpointing' if plan.checkpointing else ''})",
        "Every number with a comment below is derived as it says; the others are the base recipe's.",
        "",
        *(["The base recipe's η, σ and τ_EMA, as its header says:", *(f"  {line}" for line in base.evidence)]
          if base.evidence else [f"The base recipe does not say what its hyperparameters rest on (no paragraph "
                                 f"\"{EVIDENCE} ...\" in its header): treat them as untuned."]),
    ]


def shape_comments(args: argparse.Namespace, base: BaseRun, origin: str) -> dict[str, str]:
    """How each decoder shape field the recipe writes was set; the K/V heads and FFN width
    only where the base sets them or the command gives them."""
    comments = dict.fromkeys(("d_model", "n_layers", "n_heads", "head_dim"), origin)
    section = base.recipe["model"]["decoder"]
    if args.kv_heads is not None or "n_kv_heads" in section:
        comments["n_kv_heads"] = "given" if args.kv_heads is not None else \
            f"the base's {base.model.n_heads // base.model.n_kv_heads} query heads per key/value head"
    if args.ffn_hidden is not None or "ffn_hidden" in section:
        comments["ffn_hidden"] = "given" if args.ffn_hidden is not None else \
            f"the base's width per d_model: {base.model.ffn_dim}·d/{base.model.d_model}, rounded"
    return comments


def canonical_command(args: argparse.Namespace) -> str:
    """The command line that writes this recipe, in one fixed order."""
    parts = ["layerdrop recipe", f"--base {args.base}"]
    if args.size is not None:
        parts.append(f"--size {args.size}")
    for flag in ("d_model", "n_layers", "heads", "head_dim", "kv_heads", "ffn_hidden", "tpp", "tokens"):
        if getattr(args, flag) is not None:
            parts.append(f"--{flag.replace('_', '-')} {getattr(args, flag):g}" if isinstance(getattr(args, flag), float)
                         else f"--{flag.replace('_', '-')} {getattr(args, flag)}")
    parts += [f"--devices {args.devices}", f"--nodes {args.nodes}", f"--memory {args.memory}"]
    for flag in ("p_max", "distribution", "schedule", "name", "out"):
        if getattr(args, flag) is not None:
            parts.append(f"--{flag.replace('_', '-')} {getattr(args, flag)}")
    return shlex.join(shlex.split(" ".join(parts)))


# ------------------------------------------------------------------------------ output


def render(base: dict[str, Any], recipe: Recipe) -> str:
    """The base recipe with the derived values set, as commented YAML."""
    tree = _merge(base, recipe.values)
    lines = [f"# {line}".rstrip() for line in recipe.header]
    lines += commented_yaml(tree, recipe.comments)
    return "\n".join(lines) + "\n"


def _merge(base: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    tree = copy.deepcopy(base)
    trainer = tree["trainer"]
    order = ["accelerator", "devices", "num_nodes", "strategy", "precision", "max_steps", "accumulate_grad_batches"]
    for dotted, value in values.items():
        node = tree
        *parents, key = dotted.split(".")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[key] = value
    tree["trainer"] = {**{k: trainer[k] for k in order if k in trainer}, **trainer}
    return tree


# ------------------------------------------------------------------------------- command


def parser() -> argparse.ArgumentParser:
    from framework.schedules import DISTRIBUTIONS, TIME_SCHEDULES

    p = CommandParser(prog=PROG, description="Write a pretraining recipe by Table A.2's transfer rules "
                                "from a size, a token budget and the devices.",
                                epilog="Example: layerdrop recipe --base recipes/base.yaml --size 271M --tpp 20 "
                                       "--devices 8 --memory 141GB --p-max 0.4 --out recipes/271m.yaml")
    p.add_argument("--base", required=True, help="the base recipe whose tuned hyperparameters transfer")
    size = p.add_argument_group("size: a Table A.1 name, or the shape")
    size.add_argument("--size", help=f"one of {', '.join(PAPER_SIZES)}")
    size.add_argument("--d-model", type=int)
    size.add_argument("--n-layers", type=int)
    size.add_argument("--heads", type=int)
    size.add_argument("--head-dim", type=int, help="default d_model / heads")
    size.add_argument("--kv-heads", type=int, help="key/value heads (Llama); default: the base's grouping")
    size.add_argument("--ffn-hidden", type=int, help="FFN width (Llama); default: the base's width per d_model")
    budget = p.add_argument_group("token budget: one of")
    budget.add_argument("--tpp", type=float, help="tokens per parameter (20 is compute-optimal)")
    budget.add_argument("--tokens", help="tokens, e.g. 5.4B")
    devices = p.add_argument_group("devices")
    devices.add_argument("--devices", type=int, default=8, help="devices per node (default 8)")
    devices.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    devices.add_argument("--memory", required=True, help="memory per device, e.g. 141GB (H200) or 80GiB")
    dropout = p.add_argument_group("layer dropout (default: the base recipe's)")
    dropout.add_argument("--p-max", type=float)
    dropout.add_argument("--distribution", choices=list(DISTRIBUTIONS))
    dropout.add_argument("--schedule", choices=list(TIME_SCHEDULES))
    p.add_argument("--name", help="the run's name (runs/<name>; default: --out's file name)")
    p.add_argument("--out", help="the YAML file to write (default: print it)")
    p.add_argument("--overwrite", action="store_true", help="replace --out when it exists")
    return p


def build(argv: list[str]) -> str:
    """The recipe text for a command line (what `main` writes)."""
    args = parser().parse_args(argv)
    return render(read_base(args.base).recipe, derive(args))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser().parse_args(argv)
        if args.out and (problem := file_problem(args.out, args.overwrite)) is not None:
            raise RecipeError(f"--out {problem}")
        text = render(read_base(args.base).recipe, derive(args))
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    except ValueError as err:  # RecipeError, and a config's own one-line refusal
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.out:
        write_text(args.out, text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


__all__ = ["fit_strategy", "MemoryPlan", "Derivation", "derive", "derive_numbers", "render", "build", "main",
           "RecipeError"]


if __name__ == "__main__":
    sys.exit(main())
