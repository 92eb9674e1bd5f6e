"""A run that starts from existing weights: ``model.init_from`` (continued pretraining,
LayerSkip's recipe: a Hugging Face Llama folder, or any checkpoint layerdrop exports).

    layerdrop pretrain --config recipes/llama-continued.yaml --model.init_from /models/Llama-3.2-1B

The decoder's shape comes from the checkpoint (``pretrain`` fills ``model.decoder``
from it before anything is built), and the imported model is its own parametrization
base: d_base = d_model and n_layers_base = n_layers, so m_d = m_L = 1 and every
forward multiplier is 1 — the function of the weights is the one they were trained
for. The weights are copied in at fit start, after the (possibly sharded) model is
materialised: each rank reads every tensor (memory-mapped) and keeps its own shard.
A resumed run skips this: its checkpoint holds the trained weights.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
import torch.nn as nn

from framework.checkpoint import CheckpointError, Pieces, checkpoint_tensors, read_model_config
from framework.config import ModelConfig, ParametrizationConfig
from framework.training.parametrization import plain_name


def initial_config(path: str | os.PathLike, decoder: dict[str, Any]) -> dict[str, Any]:
    """``model.decoder`` for a run from the checkpoint at ``path``: its shape and
    function; the kernel choice (``attention``) stays the recipe's."""
    cfg = read_model_config(path)
    return {**cfg.to_dict(), "attention": decoder.get("attention", cfg.attention)}


def own_base(pcfg: ParametrizationConfig, cfg: ModelConfig) -> ParametrizationConfig:
    """The parametrization of an imported model: it is its own base (m_d = m_L = 1)."""
    return dataclasses.replace(pcfg, d_base=cfg.d_model, n_layers_base=cfg.n_layers)


@torch.no_grad()
def load_initial_weights(model: nn.Module, path: str | os.PathLike) -> None:
    """Copy the checkpoint's tensors into ``model`` (plain, compiled, checkpoint-wrapped
    or FSDP2-sharded); refuses a checkpoint whose names or shapes differ."""
    targets = {plain_name(name): tensor for name, tensor in model.state_dict().items()}
    found = set()
    for name, value in checkpoint_tensors(path):
        target = targets.get(name)
        if target is None:
            raise CheckpointError(f"{str(path)!r}: the tensor {name!r} is not in the model")
        if isinstance(value, Pieces):
            value = torch.cat([part.reshape(-1) for part in value.parts]).view(value.shape)
        if tuple(value.shape) != tuple(target.shape):
            raise CheckpointError(f"{str(path)!r}: {name} has shape {list(value.shape)}, the model's "
                                  f"{list(target.shape)}")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise CheckpointError(f"{str(path)!r} holds non-finite weights (the first {name})")
        _copy_into(target, value)
        found.add(name)
    missing = sorted(set(targets) - found)
    if missing:
        raise CheckpointError(f"{str(path)!r} does not hold every tensor of the model: missing {missing[:5]}")


def _copy_into(target: torch.Tensor, value: torch.Tensor) -> None:
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(target, DTensor):  # every rank has the full value: keep the local shard, no communication
        value = distribute_tensor(value.to(target.device, target.dtype), target.device_mesh, target.placements,
                                  src_data_rank=None)
    target.copy_(value)


__all__ = ["initial_config", "own_base", "load_initial_weights"]
