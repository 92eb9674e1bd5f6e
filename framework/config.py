"""Typed configs of the model, layer dropout and parametrization: frozen, validated once.

Each config is a frozen dataclass whose field types say what is allowed: a name is a
``Literal`` of the names a registry holds (``schedules.DISTRIBUTIONS``,
``schedules.TIME_SCHEDULES``, ``layer_dropout.MASK_MODES``), a bounded number is an
``Annotated`` type carrying its ``Rule``. ``validate`` checks every field against its
type when the config is built, so a bad recipe fails with one line naming the field
before any tensor is allocated; everything downstream trusts a config it is given and
checks nothing again. Frozen, so nothing can change a config after it was checked.

LightningCLI (jsonargparse) builds these classes from YAML and ``--section.key``
overrides, and reads the same annotations for its own type check.
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import asdict, dataclass, fields
from typing import Annotated, Any, Callable, Literal, Union

from framework.families import DEFAULT_FAMILY, FAMILY_NAMES, FamilyFields, check_family_rules
from framework.early_exit_loss import CURRICULA, SCALE_FUNCTIONS
from framework.layer_dropout import MASK_MODES
from framework.schedules import DISTRIBUTIONS, TIME_SCHEDULES

# Table A.1 of the paper. Head size is 64 up to 504M and 128 above; the head counts
# 9, 10, 14 and 21 are why ALiBi needs its rule for non-powers of two.
PAPER_SIZES: dict[str, dict[str, int]] = {
    "271M": dict(d_model=640, n_layers=13, n_heads=10, head_dim=64),
    "504M": dict(d_model=896, n_layers=17, n_heads=14, head_dim=64),
    "906M": dict(d_model=1152, n_layers=23, n_heads=9, head_dim=128),
    "1.8B": dict(d_model=1536, n_layers=30, n_heads=12, head_dim=128),
    "3.9B": dict(d_model=2048, n_layers=40, n_heads=16, head_dim=128),
    "8.2B": dict(d_model=2688, n_layers=52, n_heads=21, head_dim=128),
}
LLAMA3_VOCAB_SIZE = 128_256


# ------------------------------------------------------------------ validation


@dataclass(frozen=True)
class Rule:
    """A constraint beyond the type (``Annotated[int, POSITIVE]``), in the error's words."""

    ok: Callable[[Any], bool]
    allowed: str


POSITIVE = Rule(lambda v: v > 0, "must be > 0")
PositiveInt = Annotated[int, POSITIVE]
PositiveFloat = Annotated[float, POSITIVE]
NonNegativeInt = Annotated[int, Rule(lambda v: v >= 0, "must be >= 0")]
Rate = Annotated[float, Rule(lambda v: 0.0 <= v < 1.0, "must be in [0, 1)")]
Fraction = Annotated[float, Rule(lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]")]

DistributionName = Literal[tuple(DISTRIBUTIONS)]  # type: ignore[valid-type]
ScheduleName = Literal[tuple(TIME_SCHEDULES)]  # type: ignore[valid-type]
MaskMode = Literal[tuple(MASK_MODES)]  # type: ignore[valid-type]
FamilyName = Literal[FAMILY_NAMES]  # type: ignore[valid-type]  # a folder under framework/families/
ScaleFunctionName = Literal[tuple(SCALE_FUNCTIONS)]  # type: ignore[valid-type]
CurriculumName = Literal[tuple(CURRICULA)]  # type: ignore[valid-type]
NonNegativeFloat = Annotated[float, Rule(lambda v: v >= 0, "must be >= 0")]
# Bounded where a config value enters AdamW's float32 arithmetic: a step moves each
# weight by about lr (Adam's step is normalised), so a huge lr (1e39) overflows float32
# inside the optimizer; 1e4 leaves room for deliberate divergence tests; an ε above 1
# swamps every gradient's scale.
LearningRate = Annotated[float, Rule(lambda v: 0.0 < v <= 1e4,
                                     "must be in (0, 1e4]: AdamW moves each weight by about lr per step")]
AdamEpsilon = Annotated[float, Rule(lambda v: 0.0 < v <= 1.0,
                                    "must be in (0, 1]: ε is added to each gradient's RMS in AdamW's denominator")]


def validate(config: Any) -> None:
    """Check every field of a config dataclass against its annotated type (once, in
    ``__post_init__``); raises ``ValueError("field=value is invalid: ...")``."""
    hints = typing.get_type_hints(type(config), include_extras=True)
    for f in fields(config):
        check(f.name, getattr(config, f.name), hints[f.name])


def check(name: str, value: Any, annotation: Any) -> None:
    """One value against a type: the same rules as ``validate``, for a plain argument."""
    problem = _problem(value, annotation)
    if problem is not None:
        raise ValueError(f"{name}={value!r} is invalid: {problem}")


def _problem(value: Any, annotation: Any) -> str | None:
    """Why ``value`` does not fit ``annotation``, or None when it does."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        problem = _problem(value, args[0])
        if problem is not None:
            return problem
        return next((rule.allowed for rule in args[1:] if not rule.ok(value)), None)
    if origin in (Union, types.UnionType):
        # The option whose type the value has decides (a list of rates with a rate out
        # of range is told about the range, not about the names it is not).
        typed = [option for option in args if _problem(value, _bare(option)) is None]
        if typed:
            return _problem(value, typed[0])
        return "allowed: " + " or ".join(_describe(option) for option in args)
    if origin is Literal:
        return None if value in args else "allowed: " + ", ".join(map(str, args))
    if origin is tuple:
        if not isinstance(value, tuple):
            return f"expected {_describe(annotation)}"
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(items) != len(value):
            return f"expected {_describe(annotation)}"
        return next((f"every item {p}" for item, a in zip(value, items) if (p := _problem(item, a))), None)
    if annotation is type(None):
        return None if value is None else "expected None"
    if annotation is bool:
        return None if isinstance(value, bool) else "expected true or false"
    if annotation is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else "expected an integer"
    if annotation is float:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if number and math.isfinite(value) else "expected a finite number"
    if annotation is str:
        return None if isinstance(value, str) else "expected a string"
    raise TypeError(f"validate() does not know the type {annotation!r} of a config field")


def _bare(annotation: Any) -> Any:
    """``annotation`` without its rules: the type alone."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _bare(args[0])
    if origin is tuple:
        return tuple[tuple(_bare(a) if a is not Ellipsis else a for a in args)]
    return annotation


def _describe(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        rules = "; ".join(rule.allowed for rule in args[1:])
        return f"{_describe(args[0])} that {rules.replace('must be', 'is')}"
    if origin is Literal:
        return ", ".join(map(str, args))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list, each item {_describe(args[0])}"
        return f"a list of {len(args)} items, each {_describe(args[0])}"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            type(None): "null"}.get(annotation, str(annotation))


# --------------------------------------------------------------------- configs


@dataclass(frozen=True)
class ModelConfig(FamilyFields):
    """Shape of a decoder: the fields every family shares, then (keyword-only, from
    ``FamilyFields``) each family's own, declared in its folder (``ARGS`` of
    framework/families/<name>/rules.py, e.g. the Llama family's RoPE fields). The default
    family is the paper's Celerity decoder (pre-LN, ALiBi, squared-ReLU FFN, untied head).

    ``init_std`` is σ: the standard init's std, which the parametrization turns into
    Table A.2's per-group stds (σ for embedding and unembedding, σ/√m_d for hidden
    weights). ``logit_multiplier`` and ``residual_multiplier`` are the
    parametrization's forward multipliers (µP's 1/m_d on the unembedding, CompleteP's
    1/m_L on every residual branch); both are 1 in standard parametrization. They live
    here so an exported model computes the same function without its training config.
    """

    vocab_size: PositiveInt = 8192
    d_model: PositiveInt = 256
    n_layers: PositiveInt = 6
    n_heads: PositiveInt = 4
    head_dim: PositiveInt | None = None  # None: d_model // n_heads
    ffn_mult: PositiveInt = 8
    max_seq_len: PositiveInt = 2048
    attention: Literal["auto", "sdpa", "flex"] = "auto"
    norm_eps: PositiveFloat = 1e-5
    bias: bool = True
    init_std: PositiveFloat = 0.02
    logit_multiplier: PositiveFloat = 1.0
    residual_multiplier: PositiveFloat = 1.0
    # The block family (framework/families/<name>/): its rules check the fields, its own included.
    family: FamilyName = DEFAULT_FAMILY
    n_kv_heads: PositiveInt | None = None  # None: n_heads (no grouping)
    ffn_hidden: PositiveInt | None = None  # None: ffn_mult · d_model (HF's intermediate_size)

    def __post_init__(self) -> None:
        validate(self)
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"n_heads={self.n_heads!r} is invalid: must divide d_model={self.d_model} "
                                 "when head_dim is not given")
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)  # resolved once, here
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads={self.n_kv_heads!r} is invalid: must divide n_heads={self.n_heads}")
        check_family_rules(self)

    @property
    def attn_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def qkv_dim(self) -> int:
        """Output width of the fused query/key/value projection (fewer K/V heads under GQA)."""
        return (self.n_heads + 2 * self.n_kv_heads) * self.head_dim

    @property
    def ffn_dim(self) -> int:
        return self.ffn_hidden or self.ffn_mult * self.d_model

    @classmethod
    def paper(cls, name: str, **overrides: Any) -> "ModelConfig":
        """The Table A.1 shape ``name`` ("271M" … "8.2B") with the Llama-3 vocabulary."""
        check("name", name, Literal[tuple(PAPER_SIZES)])
        return cls(**{"vocab_size": LLAMA3_VOCAB_SIZE, **PAPER_SIZES[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        """Every field, the shared ones first (the order of the keyword arguments)."""
        data = asdict(self)
        return {f.name: data[f.name] for f in sorted(fields(self), key=lambda f: f.kw_only)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"model config keys={unknown!r} are invalid: allowed: {', '.join(known)}")
        return cls(**data)


@dataclass(frozen=True)
class LayerDropoutConfig:
    """Which blocks a training forward drops, and how (paper §3, §6, §7).

    The default is the paper's recommended recipe: increasing across depth (ILD),
    decreasing over time (DTS), r_train = 1/ρ, whole layers, one draw per sequence.
    ``p_max = 0`` is dense training. An explicit ``distribution`` (one rate per layer)
    replaces ``p_max``, so giving both is refused.

    Args:
        p_max: the largest drop rate, in [0, 1); 0 is dense training. ILD + DTS saves p_max/4 of the blocks' FLOPs
        distribution: rates across depth: uniform (p_max everywhere), increasing (ILD: l/(L-1)*p_max),
            alternating (ALD: p_max on odd layers), or an explicit list of one rate per layer
        schedule: rates over the run (max_steps): constant, increasing (ITS) or decreasing (DTS: dense at the end)
        structure: what one draw drops: the whole block (layer) or attention and FFN apart (sublayer)
        mask: one draw per sequence, one per micro-batch on each device (batch), or k of the B rows kept (count)
        r_train: the kept blocks' scale in training: 1/rho (inverse_density, the paper's) or 1 (one)
        seed: seed of the masks, drawn from (seed, rank, step, micro-batch, layer): reproducible after resume
    """

    p_max: Rate = 0.0
    distribution: DistributionName | tuple[Rate, ...] = "increasing"
    schedule: ScheduleName = "decreasing"
    structure: Literal["layer", "sublayer"] = "layer"
    mask: MaskMode = "sequence"
    r_train: Literal["inverse_density", "one"] = "inverse_density"
    seed: NonNegativeInt = 0

    def __post_init__(self) -> None:
        if isinstance(self.distribution, list):  # Python callers may pass a list
            object.__setattr__(self, "distribution", tuple(self.distribution))
        validate(self)
        if isinstance(self.distribution, tuple) and self.p_max != 0:
            raise ValueError(f"p_max={self.p_max!r} is invalid with an explicit distribution: the list gives "
                             "every layer's rate; leave p_max out")


@dataclass(frozen=True)
class EarlyExitLossConfig:
    """LayerSkip's early-exit loss (framework/early_exit_loss.py): off by default.

    ``scale`` is the exit losses' total weight beside the final layer's (0: off);
    ``exits`` "all" takes every ``every``-th exit below L, or a list of exits in 1..L-1
    (exit K runs blocks 0..K-1); ``weighting`` spreads ``scale`` over the step's exits;
    ``curriculum`` picks the step's exits (``rotation`` for "rotational", ``ramp``, the
    fraction of the run over which "gradual" switches them on, for "gradual"). A field
    that would change nothing (any field with ``scale`` 0, ``every`` beside a list, a
    curriculum's knob under another curriculum) is refused, not ignored.
    """

    scale: NonNegativeFloat = 0.0
    exits: Literal["all"] | tuple[PositiveInt, ...] = "all"
    every: PositiveInt = 1
    weighting: ScaleFunctionName = "uniform"
    curriculum: CurriculumName = "none"
    rotation: Annotated[int, Rule(lambda v: v >= 2, "must be >= 2")] = 2
    ramp: Annotated[float, Rule(lambda v: 0.0 < v <= 1.0, "must be in (0, 1]")] = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.exits, list):  # Python callers may pass a list
            object.__setattr__(self, "exits", tuple(self.exits))
        validate(self)
        if isinstance(self.exits, tuple) and (not self.exits or len(set(self.exits)) != len(self.exits)):
            raise ValueError(f"early_exit_loss.exits={list(self.exits)!r} is invalid: need distinct exits, "
                             "at least one")
        defaults = EarlyExitLossConfig.__dataclass_fields__
        unused = {"every": isinstance(self.exits, tuple), "rotation": self.curriculum != "rotational",
                  "ramp": self.curriculum != "gradual"}
        for name in ("exits", "every", "weighting", "curriculum", "rotation", "ramp"):
            value = getattr(self, name)
            if value != defaults[name].default and (self.scale == 0 or unused.get(name, False)):
                why = "the early-exit loss is off (scale=0)" if self.scale == 0 else \
                    ("exits is a list" if name == "every" else f"curriculum={self.curriculum!r}")
                raise ValueError(f"early_exit_loss.{name}={value!r} is invalid: it changes nothing when {why}")


@dataclass(frozen=True)
class ParametrizationConfig:
    """Table A.2: µP + CompleteP + layer density, transferred from a base model.

    ``kind="standard"`` turns every multiplier into 1 (plain AdamW, one LR, one init
    std); ``"complete_p"`` applies the width (m_d = d/d_base) and depth
    (m_L = L/L_base) rules to the base model's η and ε (σ is ``decoder.init_std``).
    Weight decay is set through the EMA timescale τ_EMA = B/(η·λ·D) (Wang &
    Aitchison), so λ = B/(η·τ_EMA·D); ``tau_ema`` is this run's τ_EMA, which
    ``layerdrop recipe`` transfers from the base run's.
    """

    kind: Literal["complete_p", "standard"] = "complete_p"
    d_base: PositiveInt = 256
    n_layers_base: PositiveInt = 6
    lr: LearningRate = 3e-3  # η_base
    eps: AdamEpsilon = 1e-8  # AdamW ε_base
    tau_ema: PositiveFloat = 0.2  # τ_EMA as a fraction of the run
    betas: tuple[Rate, Rate] = (0.9, 0.95)

    def __post_init__(self) -> None:
        if isinstance(self.betas, list):
            object.__setattr__(self, "betas", tuple(self.betas))
        validate(self)


__all__ = [
    "ModelConfig",
    "LayerDropoutConfig",
    "EarlyExitLossConfig",
    "ParametrizationConfig",
    "PAPER_SIZES",
    "LLAMA3_VOCAB_SIZE",
    "Rule",
    "validate",
    "check",
    "PositiveInt",
    "PositiveFloat",
    "NonNegativeInt",
    "NonNegativeFloat",
    "Rate",
    "Fraction",
]
