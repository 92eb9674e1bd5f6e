"""µP + CompleteP + layer density (paper Table A.2): hyperparameters tuned on a small
base model transfer to a wider (m_d = d/d_base) and deeper (m_L = L/L_base) one.

| parameters                           | init std    | AdamW LR | AdamW ε        | weight decay |
|--------------------------------------|-------------|----------|----------------|--------------|
| hidden: blocks' qkv/proj/up/down W   | σ/sqrt(m_d) | η/m_d    | ε/(m_d·m_L)    | λ            |
| blocks' LayerNorms and biases        | 1 / 0       | η        | ε/(m_d·m_L)    | 0            |
| embedding                            | σ           | η        | ε/m_d          | 0            |
| final LayerNorm                      | 1 / 0       | η        | ε/m_d          | 0            |
| unembedding (head)                   | σ           | η        | ε/m_d          | 0            |

Forward multipliers (ModelConfig): unembedding output × 1/m_d (µP), every residual
branch × 1/m_L (CompleteP, α = 1); the layer-density factor 1/ρ of Table A.2's
residual rule is the drop plan's r_train, not part of this module.

Choices where Table A.2 is silent, and why:
- ε follows the gradient scale. Everything inside a residual block (its norms and
  biases too) sits behind the 1/m_L branch multiplier, so it gets the residual-block
  ε; the final LayerNorm sits beside the unembedding and gets its ε/m_d.
- Weight decay only on hidden weights: Table A.2 has a "Hidden WD" row and no other.
- Weight decay through the EMA timescale of Wang & Aitchison as Power Lines (Bergsma
  et al., 2025a) normalise it: τ_EMA = B/(η·λ·D) with B and D in the same unit
  (tokens), i.e. τ_EMA is a fraction of the run (B/D = 1/steps), and η is the LR of
  the group that decays (η/m_d for hidden weights, as in Table A.2's scaled column).
  AdamW decays by lr·λ per step, so its EMA spans 1/(η·λ) steps = τ_EMA of the run.

``kind="standard"`` sets m_d = m_L = 1: one LR, one ε, one init std, multipliers 1,
and the same weight-decay rule on the hidden weights.

Table A.2's data-size rows (B = B_base·m_D^0.4, τ_EMA = τ_base·(TPP/TPP_base)^-0.5)
change the run, not the model: ``layerdrop recipe`` (framework/recipes/recipe.py) applies
them with ``transfer_batch_size`` and ``transfer_tau_ema`` when it writes a recipe.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from framework.config import ModelConfig, ParametrizationConfig
from framework.model.decoder import EMBEDDING, FINAL_NORM, HIDDEN, NORMS_AND_BIASES, UNEMBEDDING, plain_name


def width_depth_multipliers(pcfg: ParametrizationConfig, d_model: int,
                            n_layers: int) -> tuple[float, float]:
    """(m_d, m_L); both 1 in standard parametrization."""
    if pcfg.kind == "standard":
        return 1.0, 1.0
    return d_model / pcfg.d_base, n_layers / pcfg.n_layers_base


def model_multipliers(pcfg: ParametrizationConfig, model_cfg: ModelConfig) -> dict[str, float]:
    """The forward multipliers to put into ModelConfig (µP's 1/m_d, CompleteP's 1/m_L)."""
    m_d, m_l = width_depth_multipliers(pcfg, model_cfg.d_model, model_cfg.n_layers)
    return {"logit_multiplier": 1.0 / m_d, "residual_multiplier": 1.0 / m_l}


def groups_of(decoder: nn.Module) -> dict[str, str]:
    """Every parameter name of ``decoder`` (as ``named_parameters`` gives it, wrapper
    segments and all) -> its group, as the decoder's family declares it
    (``Decoder.parameter_groups``). A parameter the family does not declare raises: it
    never lands in a default group."""
    declared = decoder.parameter_groups()
    groups = {}
    for name, _ in decoder.named_parameters():
        group = declared.get(plain_name(name))
        if group is None:
            raise ValueError(f"parameter {name!r} has no parametrization group: its family's Decoder."
                             "parameter_groups (or its block's) does not declare it")
        groups[name] = group
    return groups


def init_stds(pcfg: ParametrizationConfig, model_cfg: ModelConfig) -> dict[str, float | None]:
    """Init std of each group from σ = ``model_cfg.init_std``; None for LayerNorms and
    biases (they start at 1 and 0)."""
    m_d, _ = width_depth_multipliers(pcfg, model_cfg.d_model, model_cfg.n_layers)
    sigma = model_cfg.init_std
    return {HIDDEN: sigma / math.sqrt(m_d), NORMS_AND_BIASES: None, EMBEDDING: sigma,
            FINAL_NORM: None, UNEMBEDDING: sigma}


def optimizer_hyperparameters(pcfg: ParametrizationConfig, model_cfg: ModelConfig, *,
                              total_tokens: float, batch_tokens: float) -> dict[str, dict[str, float]]:
    """{group: {"lr", "eps", "weight_decay"}} for AdamW per Table A.2."""
    m_d, m_l = width_depth_multipliers(pcfg, model_cfg.d_model, model_cfg.n_layers)
    eta, eps = pcfg.lr, pcfg.eps
    hidden_lr = eta / m_d
    decay = weight_decay(hidden_lr, pcfg.tau_ema, batch_tokens=batch_tokens, total_tokens=total_tokens)
    block_eps, outer_eps = eps / (m_d * m_l), eps / m_d
    return {
        HIDDEN: dict(lr=hidden_lr, eps=block_eps, weight_decay=decay),
        NORMS_AND_BIASES: dict(lr=eta, eps=block_eps, weight_decay=0.0),
        EMBEDDING: dict(lr=eta, eps=outer_eps, weight_decay=0.0),
        FINAL_NORM: dict(lr=eta, eps=outer_eps, weight_decay=0.0),
        UNEMBEDDING: dict(lr=eta, eps=outer_eps, weight_decay=0.0),
    }


def weight_decay(lr: float, tau_ema: float, *, batch_tokens: float, total_tokens: float) -> float:
    """AdamW λ = B/(η·τ_EMA·D), τ_EMA a fraction of the run, B and D in tokens."""
    return batch_tokens / (lr * tau_ema * total_tokens)


def transfer_batch_size(batch_size_base: float, data_multiplier: float) -> float:
    """Power Lines' batch size B = B_base·m_D^0.4 (m_D = D/D_base), unrounded."""
    return batch_size_base * data_multiplier ** 0.4


def transfer_tau_ema(tau_ema_base: float, tokens_per_parameter: float, tpp_base: float) -> float:
    """τ_EMA = τ_EMA,base·(TPP/TPP_base)^-0.5: longer runs average over a smaller fraction."""
    return tau_ema_base * (tokens_per_parameter / tpp_base) ** -0.5


@torch.no_grad()
def init_decoder_(decoder: nn.Module, pcfg: ParametrizationConfig,
                  generator: torch.Generator | None = None) -> nn.Module:
    """Re-initialise a Decoder in place per Table A.2 (LayerNorms 1/0, biases 0)."""
    model_cfg = _checked_config(decoder, pcfg)
    stds = init_stds(pcfg, model_cfg)
    groups = groups_of(decoder)
    owners = {f"{prefix}.{name}" if prefix else name: module for prefix, module in decoder.named_modules()
              for name, _ in module.named_parameters(recurse=False)}
    reset = set()
    for name, param in decoder.named_parameters():
        std = stds[groups[name]]
        owner = owners[name]
        if std is not None:
            nn.init.normal_(param, mean=0.0, std=std, generator=generator)
        elif isinstance(owner, nn.Linear):  # a bias
            nn.init.zeros_(param)
        elif id(owner) not in reset:  # a norm: its identity (weight 1 and bias 0 for a LayerNorm)
            owner.reset_parameters()
            reset.add(id(owner))
    return decoder


def param_groups(decoder: nn.Module, pcfg: ParametrizationConfig, *, total_tokens: float,
                 batch_tokens: float) -> list[dict]:
    """AdamW parameter groups (params, lr, eps, weight_decay, name) for ``decoder``.

    ``total_tokens`` and ``batch_tokens`` (per optimizer step, all devices) set the
    weight decay through ``pcfg.tau_ema``. Frozen parameters are left out; empty
    groups too.
    """
    model_cfg = _checked_config(decoder, pcfg)
    hyper = optimizer_hyperparameters(pcfg, model_cfg, total_tokens=total_tokens, batch_tokens=batch_tokens)
    members: dict[str, list[nn.Parameter]] = {group: [] for group in hyper}
    groups = groups_of(decoder)
    for name, param in decoder.named_parameters():
        if param.requires_grad:
            members[groups[name]].append(param)
    return [dict(name=group, params=params, lr=hyper[group]["lr"], eps=hyper[group]["eps"],
                 weight_decay=hyper[group]["weight_decay"])
            for group, params in members.items() if params]


def adamw(decoder: nn.Module, pcfg: ParametrizationConfig, *, total_tokens: float,
          batch_tokens: float, **kwargs) -> torch.optim.AdamW:
    """torch.optim.AdamW over ``param_groups`` with the config's betas."""
    groups = param_groups(decoder, pcfg, total_tokens=total_tokens, batch_tokens=batch_tokens)
    return torch.optim.AdamW(groups, betas=pcfg.betas, **kwargs)


def _checked_config(decoder: nn.Module, pcfg: ParametrizationConfig) -> ModelConfig:
    """The decoder's ModelConfig, after checking that its forward multipliers are the
    ones this parametrization prescribes: LRs for m_d = 2 on a model whose logits are
    not divided by 2 would train silently wrong."""
    model_cfg = getattr(decoder, "config", None)
    if not isinstance(model_cfg, ModelConfig):
        raise ValueError(f"decoder of type {type(decoder).__name__} has no ModelConfig "
                         "`config` attribute: expected a framework.model.Decoder")
    for key, expected in model_multipliers(pcfg, model_cfg).items():
        actual = getattr(model_cfg, key)
        if not math.isclose(actual, expected, rel_tol=1e-9):
            raise ValueError(f"{key}={actual!r} is invalid for parametrization "
                             f"kind={pcfg.kind!r}: expected {expected!r}; build the model "
                             "config with model_multipliers(pcfg, model_cfg)")
    return model_cfg


__all__ = [
    "HIDDEN",
    "NORMS_AND_BIASES",
    "EMBEDDING",
    "FINAL_NORM",
    "UNEMBEDDING",
    "width_depth_multipliers",
    "model_multipliers",
    "groups_of",
    "plain_name",
    "init_stds",
    "optimizer_hyperparameters",
    "weight_decay",
    "transfer_batch_size",
    "transfer_tau_ema",
    "init_decoder_",
    "param_groups",
    "adamw",
]
