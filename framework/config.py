"""Typed configs of the model, layer dropout and parametrization, validated once.

Every invalid value raises ``ValueError`` naming the field, the value and what is
allowed, so a bad recipe fails before any tensor is allocated.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Sequence

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

ATTENTION_BACKENDS = ("auto", "sdpa", "flex")
DISTRIBUTIONS = ("uniform", "increasing", "alternating")
SCHEDULES = ("constant", "increasing", "decreasing")
STRUCTURES = ("layer", "sublayer")
MASKS = ("sequence", "batch", "count")
R_TRAIN = ("inverse_density", "one")
PARAMETRIZATIONS = ("complete_p", "standard")


def _require(ok: bool, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} is invalid: {allowed}")


def _positive_int(name: str, value: Any) -> None:
    _require(isinstance(value, int) and not isinstance(value, bool) and value > 0,
             name, value, "must be a positive integer")


def _positive_float(name: str, value: Any) -> None:
    _require(isinstance(value, (int, float)) and not isinstance(value, bool)
             and math.isfinite(value) and value > 0, name, value, "must be a positive number")


def _one_of(name: str, value: Any, allowed: Sequence[str]) -> None:
    _require(value in allowed, name, value, f"allowed: {', '.join(allowed)}")


@dataclass
class ModelConfig:
    """Shape of the Celerity-style decoder (pre-LN, ALiBi, squared-ReLU FFN, untied head).

    ``logit_multiplier`` and ``residual_multiplier`` are the parametrization's
    forward multipliers (µP's 1/m_d on the unembedding, CompleteP's 1/m_L on every
    residual branch); both are 1 in standard parametrization. They live here so an
    exported model computes the same function without its training config.
    """

    vocab_size: int = 8192
    d_model: int = 256
    n_layers: int = 6
    n_heads: int = 4
    head_dim: int | None = None  # None: d_model // n_heads
    ffn_mult: int = 8
    max_seq_len: int = 2048
    attention: str = "auto"  # "auto" | "sdpa" | "flex"
    norm_eps: float = 1e-5
    bias: bool = True
    init_std: float = 0.02
    logit_multiplier: float = 1.0
    residual_multiplier: float = 1.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "ffn_mult", "max_seq_len"):
            _positive_int(name, getattr(self, name))
        if self.head_dim is None:
            _require(self.d_model % self.n_heads == 0, "n_heads", self.n_heads,
                     f"must divide d_model={self.d_model} when head_dim is not given")
            self.head_dim = self.d_model // self.n_heads
        _positive_int("head_dim", self.head_dim)
        _one_of("attention", self.attention, ATTENTION_BACKENDS)
        for name in ("norm_eps", "init_std", "logit_multiplier", "residual_multiplier"):
            _positive_float(name, getattr(self, name))

    @property
    def attn_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def ffn_dim(self) -> int:
        return self.ffn_mult * self.d_model

    @classmethod
    def paper(cls, name: str, **overrides: Any) -> "ModelConfig":
        """The Table A.1 shape ``name`` ("271M" … "8.2B") with the Llama-3 vocabulary."""
        _one_of("name", name, tuple(PAPER_SIZES))
        return cls(**{"vocab_size": LLAMA3_VOCAB_SIZE, **PAPER_SIZES[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        _require(not unknown, "model config keys", unknown, f"allowed: {', '.join(sorted(known))}")
        return cls(**data)


@dataclass
class LayerDropoutConfig:
    """Which blocks a training forward drops, and how (paper §3, §6, §7).

    The default is the paper's recommended recipe: increasing across depth (ILD),
    decreasing over time (DTS), r_train = 1/ρ, whole layers, one draw per sequence.
    ``p_max = 0`` is dense training.
    """

    p_max: float = 0.0
    distribution: str | list[float] = "increasing"
    schedule: str = "decreasing"
    structure: str = "layer"
    mask: str = "sequence"
    r_train: str = "inverse_density"
    seed: int = 0

    def __post_init__(self) -> None:
        _require(isinstance(self.p_max, (int, float)) and not isinstance(self.p_max, bool)
                 and 0.0 <= self.p_max < 1.0, "p_max", self.p_max, "must be in [0, 1)")
        if isinstance(self.distribution, (list, tuple)):
            self.distribution = [float(p) for p in self.distribution]
            for p in self.distribution:
                _require(0.0 <= p < 1.0, "distribution", self.distribution,
                         "every explicit per-layer rate must be in [0, 1)")
        else:
            _one_of("distribution", self.distribution,
                    DISTRIBUTIONS + ("or an explicit list of per-layer rates",))
        _one_of("schedule", self.schedule, SCHEDULES)
        _one_of("structure", self.structure, STRUCTURES)
        _one_of("mask", self.mask, MASKS)
        _one_of("r_train", self.r_train, R_TRAIN)
        _require(isinstance(self.seed, int) and self.seed >= 0, "seed", self.seed,
                 "must be a non-negative integer")

    @property
    def enabled(self) -> bool:
        if isinstance(self.distribution, list):
            return any(p > 0 for p in self.distribution)
        return self.p_max > 0

    def check_layers(self, num_layers: int) -> None:
        """An explicit list must have one rate per layer."""
        if isinstance(self.distribution, list):
            _require(len(self.distribution) == num_layers, "distribution", self.distribution,
                     f"an explicit list needs one rate per layer ({num_layers})")


@dataclass
class ParametrizationConfig:
    """Table A.2: µP + CompleteP + layer density, transferred from a base model.

    ``kind="standard"`` turns every multiplier into 1 (plain AdamW, one LR, one init
    std); ``"complete_p"`` applies the width (m_d = d/d_base) and depth
    (m_L = L/L_base) rules. Weight decay is set through the EMA timescale
    τ_EMA = B/(η·λ·D) (Wang & Aitchison), so λ = B/(η·τ_EMA·D).
    """

    kind: str = "complete_p"
    d_base: int = 256
    n_layers_base: int = 6
    init_std: float = 0.02  # σ_base
    lr: float = 3e-3  # η_base
    eps: float = 1e-8  # AdamW ε_base
    tau_ema: float = 0.2  # τ_EMA as a fraction of the run (base), see docs
    batch_size_base: int = 32  # B_base in sequences
    tpp_base: float = 20.0  # tokens per parameter of the base run
    betas: tuple[float, float] = (0.9, 0.95)

    def __post_init__(self) -> None:
        _one_of("kind", self.kind, PARAMETRIZATIONS)
        _positive_int("d_base", self.d_base)
        _positive_int("n_layers_base", self.n_layers_base)
        _positive_int("batch_size_base", self.batch_size_base)
        for name in ("init_std", "lr", "eps", "tau_ema", "tpp_base"):
            _positive_float(name, getattr(self, name))
        self.betas = tuple(float(b) for b in self.betas)  # type: ignore[assignment]
        _require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "betas",
                 self.betas, "two numbers in [0, 1)")


__all__ = [
    "ModelConfig",
    "LayerDropoutConfig",
    "ParametrizationConfig",
    "PAPER_SIZES",
    "LLAMA3_VOCAB_SIZE",
]
