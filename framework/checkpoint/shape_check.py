"""A checkpoint's stored names and shapes against its config, before anything is built:
the project's own checkpoints and Hugging Face folders (from their safetensors headers)
get the same one-line refusal. The model is a one-block stand-in on the meta device, so a
config that asks for 10^7 blocks or 10^12 rows costs nothing to refuse."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from framework.checkpoint.base import check_names, check_shape
from framework.config import ModelConfig
from framework.families.registry import build_decoder, family_spec
from framework.model.decoder import Decoder

_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def check_config_against(cfg: ModelConfig, stored: dict[str, Any], path: Path) -> None:
    """The names and shapes ``cfg`` implies against those the checkpoint stores, before
    anything is built: the count of blocks first (cheap: a config may ask for 10^7), then
    every tensor, from a one-block stand-in built on the meta device."""
    blocks = {int(m[1]) for name in stored if (m := _BLOCK.match(name))}
    if len(blocks) != cfg.n_layers:  # named as the full comparison would, without listing 10^7 blocks
        suffixes = [name[len("blocks.0."):] for name in stored if name.startswith("blocks.0.")] or ["*"]
        missing = (f"blocks.{i}.{suffix}" for i in range(len(blocks), cfg.n_layers) for suffix in suffixes)
        unexpected = [name for name in stored if (m := _BLOCK.match(name)) and int(m[1]) >= cfg.n_layers]
        check_names(path, list(itertools.islice(missing, 5)), unexpected)
    # The family's one-block stand-in (cheap however many heads the config names, where
    # its shapes allow: ALiBi slopes are computed per head).
    standin = meta_decoder(family_spec(cfg.family).standin_config(cfg)).state_dict()
    expected = {}
    for name, tensor in standin.items():
        if name.startswith("blocks.0."):
            expected.update({f"blocks.{i}.{name[9:]}": tensor.shape for i in range(cfg.n_layers)})
        else:
            expected[name] = tensor.shape
    check_names(path, [n for n in expected if n not in stored], [n for n in stored if n not in expected])
    for name, shape in expected.items():
        check_shape(path, name, stored[name], shape)


class _NoRandomInitOnMeta(TorchFunctionMode):
    """Meta tensors hold no values, so their random init is skipped: a ``normal_`` on
    the meta device runs torch's Python reference, whose first call imports
    torch._dynamo (measured: about as long as ``import torch`` itself)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in (torch.nn.init.normal_, torch.Tensor.normal_):
            tensor = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def meta_decoder(cfg: ModelConfig) -> Decoder:
    """The config's decoder (its family's) with every tensor on the meta device: shapes
    and names, no storage."""
    with torch.device("meta"), _NoRandomInitOnMeta():
        return build_decoder(cfg)


__all__ = ["check_config_against", "meta_decoder"]
