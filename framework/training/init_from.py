"""A run that starts from existing weights: ``model.init_from`` (continued pretraining,
LayerSkip's recipe: a Hugging Face folder of a family with a transformers class, or any
checkpoint layerdrop writes but an FSDP2 folder, which is exported first).

    layerdrop pretrain --config recipes/llama-continued.yaml --model.init_from /models/Llama-3.2-1B

The checkpoint is opened once per command (``framework.checkpoint.Checkpoint``: proven
harmless, its config read): `layerdrop pretrain` opens it to fill ``model.decoder``
before anything is built and hands the opened checkpoint to the LightningModule it builds
(``handed_over``), which checks its model against it, lets the tokenizer check read it,
and copies its weights in at fit start with ``framework.checkpoint.base.copy_into``, the
way every reader fills a decoder.

The imported model is its own parametrization base: d_base = d_model and n_layers_base =
n_layers, so m_d = m_L = 1 and every forward multiplier is 1 — the function of the
weights is the one they were trained for. The weights are copied after the (possibly
sharded) model is materialised: each rank reads every tensor (memory-mapped) and keeps
its own shard. A resumed run skips this: its checkpoint holds the trained weights.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn

from framework.checkpoint import Checkpoint
from framework.checkpoint.base import copy_into
from framework.config import ModelConfig, ParametrizationConfig

# The checkpoints a caller opened for the modules it is building (``handed_over``).
_HANDED_OVER: list[Checkpoint] = []


@contextmanager
def handed_over(ckpt: Checkpoint | None) -> Iterator[None]:
    """While it runs, ``initial_checkpoint`` of ``ckpt``'s path is ``ckpt`` itself (`layerdrop
    pretrain` builds its LightningModule inside, from the config it filled from ``ckpt``)."""
    if ckpt is None:
        yield
        return
    _HANDED_OVER.append(ckpt)
    try:
        yield
    finally:
        _HANDED_OVER.remove(ckpt)


def initial_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """The checkpoint at ``path``, opened: the one handed over, else opened here."""
    return next((ckpt for ckpt in _HANDED_OVER if str(ckpt.path) == str(path)), None) or Checkpoint.open(path)


def initial_config(ckpt: Checkpoint, decoder: dict[str, Any]) -> dict[str, Any]:
    """``model.decoder`` for a run from ``ckpt``: its shape and function; the kernel choice
    (``attention``) stays the recipe's."""
    cfg = ckpt.model_config
    return {**cfg.to_dict(), "attention": decoder.get("attention", cfg.attention)}


def own_base(pcfg: ParametrizationConfig, cfg: ModelConfig) -> ParametrizationConfig:
    """The parametrization of an imported model: it is its own base (m_d = m_L = 1)."""
    return dataclasses.replace(pcfg, d_base=cfg.d_model, n_layers_base=cfg.n_layers)


@torch.no_grad()
def load_initial_weights(model: nn.Module, ckpt: Checkpoint) -> None:
    """Copy the checkpoint's tensors into ``model`` (plain, compiled, checkpoint-wrapped or
    FSDP2-sharded); refuses a checkpoint whose names or shapes differ, or whose weights
    are not finite."""
    copy_into(model, ckpt.tensors(), ckpt.path)


__all__ = ["handed_over", "initial_checkpoint", "initial_config", "own_base", "load_initial_weights"]
