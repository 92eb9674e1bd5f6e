"""What `layerdrop recipe` starts from: the command's values (sizes, counts, the target
decoder, its layer dropout) and the base run whose quantities Table A.2's rules scale
(framework/recipes/recipe.py, whose docstring states the rules). Every bad value is a
``RecipeError``: one line naming it and what is allowed.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from framework.config import PAPER_SIZES, LayerDropoutConfig, ModelConfig, ParametrizationConfig
from framework.files.nesting import NestingError, yaml_document
from framework.recipes.device_memory import ModelSizes

UNITS = {"GB": 1e9, "GIB": 2**30, "TB": 1e12, "TIB": 2**40, "MB": 1e6, "MIB": 2**20}
COUNT_SUFFIXES = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


class RecipeError(ValueError):
    """Bad input to `layerdrop recipe`: one line naming the value and what is allowed."""


# -------------------------------------------------------------------------- inputs


def byte_size(text: str) -> float:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in UNITS or float(match.group(1)) <= 0:
        raise RecipeError(f"--memory={text!r} is invalid: a positive size with a unit, e.g. 141GB or 80GiB")
    return float(match.group(1)) * UNITS[unit]


def token_count(text: str) -> float:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([KMBGT]?)\s*", text, re.IGNORECASE)
    if not match or float(match.group(1)) <= 0:
        raise RecipeError(f"--tokens={text!r} is invalid: a positive count, e.g. 5.4B, 300M or 2e9")
    return float(match.group(1)) * COUNT_SUFFIXES[match.group(2).upper()]


# Set by the target's shape, and by the parametrization at run time; every other decoder
# field (the family and its shape-free fields: vocabulary, context, kernel, RoPE, tying) is the base's.
NOT_INHERITED = ("d_model", "n_layers", "n_heads", "head_dim", "n_kv_heads", "ffn_hidden",
                 "logit_multiplier", "residual_multiplier")


def model_config(args: argparse.Namespace, base: ModelConfig) -> tuple[ModelConfig, str]:
    """The target decoder (the base's family and shape-free fields) and how it was named."""
    explicit = [args.d_model, args.n_layers, args.heads]
    if args.size is not None and any(v is not None for v in [*explicit, args.head_dim]):
        raise RecipeError("--size and --d-model/--n-layers/--heads/--head-dim are invalid together: give one")
    shared = {k: v for k, v in base.to_dict().items() if k not in NOT_INHERITED}
    if args.size is not None:
        names = {name.lower(): name for name in PAPER_SIZES}
        if args.size.lower() not in names:
            raise RecipeError(f"--size={args.size!r} is invalid: allowed: {', '.join(PAPER_SIZES)} "
                              "(or --d-model, --n-layers and --heads)")
        name = names[args.size.lower()]
        shape, origin = dict(PAPER_SIZES[name]), f"Table A.1's {name}"
    elif any(v is None for v in explicit):
        raise RecipeError("--size is missing: give a Table A.1 name or all of --d-model, --n-layers and --heads")
    else:
        shape = {"d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.heads, "head_dim": args.head_dim}
        origin = "given"
    return ModelConfig(**shared, **shape, **grouping_and_ffn(args, base, shape)), origin


def grouping_and_ffn(args: argparse.Namespace, base: ModelConfig, shape: dict[str, Any]) -> dict[str, Any]:
    """K/V heads and FFN width: given, or the base's query heads per K/V head and FFN
    width per d_model (None where the base has neither, as Celerity's)."""
    group, kv_heads, ffn_hidden = base.n_heads // base.n_kv_heads, args.kv_heads, args.ffn_hidden
    if kv_heads is None and shape["n_heads"] % group:
        raise RecipeError(f"n_heads={shape['n_heads']} is invalid: the base shares each key/value head among "
                          f"{group} query heads; give --kv-heads")
    if kv_heads is None and group > 1:
        kv_heads = shape["n_heads"] // group
    if ffn_hidden is None and base.ffn_hidden is not None:
        ffn_hidden = round(base.ffn_hidden * shape["d_model"] / base.d_model)
    return {"n_kv_heads": kv_heads, "ffn_hidden": ffn_hidden}


def layer_dropout_config(args: argparse.Namespace, base: dict[str, Any]) -> LayerDropoutConfig:
    """The base recipe's layer dropout with the command line's choices on top."""
    given = {key: getattr(args, key) for key in ("p_max", "distribution", "schedule")
             if getattr(args, key) is not None}
    return LayerDropoutConfig(**{**base, **given})


# ---------------------------------------------------------------------- the base run


@dataclass(frozen=True)
class BaseRun:
    """What the base recipe ran: the base quantities of Table A.2."""

    recipe: dict[str, Any]
    model: ModelConfig
    parametrization: ParametrizationConfig
    parameters: int
    batch_size: int  # B_base, sequences per optimizer step
    seq_len: int
    steps: int
    evidence: list[str]  # the base's "What its hyperparameters rest on" paragraph, or []

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * self.seq_len

    @property
    def tpp(self) -> float:
        return self.tokens / self.parameters


def read_base(path: str) -> BaseRun:
    try:
        text = Path(path).read_text()
        recipe = yaml_document(text, f"--base={path!r}")
    except NestingError as err:
        raise RecipeError(str(err)) from None
    except (OSError, yaml.YAMLError) as err:
        raise RecipeError(f"--base={path!r} is invalid: {str(err).splitlines()[0]}") from None
    try:
        trainer, model, data = recipe["trainer"], recipe["model"], recipe["data"]
        decoder = ModelConfig(**model["decoder"])
        pcfg = ParametrizationConfig(**model.get("parametrization", {}))
        batch = data["batch_size"] * trainer["devices"] * trainer.get("num_nodes", 1) * \
            trainer.get("accumulate_grad_batches", 1)
        seq_len, steps = data["seq_len"], trainer["max_steps"]
    except (KeyError, TypeError, ValueError) as err:
        raise RecipeError(f"--base={path!r} is invalid: not a pretraining recipe ({err})") from None
    if pcfg.kind != "complete_p" or (pcfg.d_base, pcfg.n_layers_base) != (decoder.d_model, decoder.n_layers):
        raise RecipeError(f"--base={path!r} is invalid: a base recipe trains the parametrization's base model "
                          f"(kind complete_p, d_model = d_base, n_layers = n_layers_base); it has {pcfg.kind}, "
                          f"d_model {decoder.d_model} / d_base {pcfg.d_base}, n_layers {decoder.n_layers} / "
                          f"n_layers_base {pcfg.n_layers_base}")
    return BaseRun(recipe, decoder, pcfg, parameter_count(decoder), batch, seq_len, steps,
                   evidence_paragraph(text))


EVIDENCE = "What its hyperparameters rest on"


def evidence_paragraph(text: str) -> list[str]:
    """The paragraph of the base's leading comment that starts with EVIDENCE, up to the
    next blank comment line: where η, σ, τ_EMA were tuned and which transfer evidence
    they carry. Every recipe derived from the base repeats it in its header, so a
    paper-size recipe says what it rests on."""
    header = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        header.append(line[1:].removeprefix(" ").rstrip())
    start = next((i for i, line in enumerate(header) if line.startswith(EVIDENCE)), None)
    if start is None:
        return []
    end = next((i for i in range(start + 1, len(header)) if not header[i].strip()), len(header))
    return header[start:end]


def parameter_count(cfg: ModelConfig) -> int:
    """Exact, from the Decoder itself (built on the meta device: no memory)."""
    return ModelSizes.of(cfg).parameters


__all__ = ["RecipeError", "byte_size", "token_count", "model_config", "layer_dropout_config", "BaseRun", "read_base",
           "EVIDENCE", "parameter_count"]
