"""The words every checkpoint module shares: file names, the one error, ``Pieces``, and
the small protocol each on-disk form implements (one module per form, listed in
framework/checkpoint/forms.py).

This module imports nothing of the package (it is the bottom of it), and no Lightning:
a command that only reads a checkpoint stays light.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.nn as nn

from framework.config import ModelConfig
from framework.model.decoder import plain_name
from framework.tokenizer import TOKENIZER_FILE

if TYPE_CHECKING:  # annotations only: a form fills a Decoder, it never builds one
    from framework.model.decoder import Decoder

CKPT_KEY = "layerdrop"  # checkpoint["layerdrop"]: model_config, tokenizer, data_dir, ...
MODEL_PREFIX = "model."  # the LightningModule keeps the decoder as ``self.model``
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
# What is not metadata in a Lightning or DeepSpeed checkpoint dict.
TENSOR_ENTRIES = ("state_dict", "optimizer_states", "module", "optimizer")


class CheckpointError(ValueError):
    """A checkpoint path or content that cannot be loaded; the message says why."""


@dataclass
class Pieces:
    """A tensor of ``shape`` stored as 1-D pieces that follow each other (a ZeRO
    partition per rank): copied into place piece by piece, never assembled first."""

    shape: tuple[int, ...]
    parts: list[torch.Tensor]


class Form(Protocol):
    """One on-disk form of a trained decoder. ``name`` is what ``checkpoint_form``
    answers; the methods take the checkpoint's path (a file or a folder)."""

    name: str
    described: str  # for the error that names every form: "a .ckpt file"
    self_contained: bool  # True: config, weights and tokenizer inside the folder (an export)

    def detect(self, path: Path) -> bool:
        """Whether ``path`` (which exists) is in this form; cheap: names only."""

    def incomplete_reason(self, path: Path) -> str | None:
        """Why ``path`` is not a whole checkpoint (cut short, a shard missing), from
        names and sizes; None when it is complete."""

    def prove_harmless(self, path: Path) -> None:
        """Raise CheckpointError naming the first file a library would unpickle that
        could run code."""

    def open(self, path: Path) -> Form:
        """This form bound to the checkpoint at ``path``, proven harmless: what the proof
        read (a .ckpt file: its one weights-only, memory-mapped load) serves the questions
        after it, so an opened ``Checkpoint`` reads each file once. A form that keeps
        nothing proves and returns itself."""

    def metadata(self, path: Path) -> dict[str, Any]:
        """The non-tensor entries (Lightning's checkpoint dict without the weights and
        optimizer state; an export's config.json), read by weights-only rules."""

    def model_config(self, path: Path, metadata: dict[str, Any]) -> ModelConfig:
        """The checkpoint's ModelConfig, from its ``metadata`` (CheckpointError when
        there is none or it is invalid)."""

    def load_into(self, decoder: Decoder, path: Path) -> None:
        """Fill every tensor of ``decoder`` from the checkpoint (names and shapes
        checked), one tensor at a time."""

    def shapes(self, path: Path) -> dict[str, Any] | None:
        """Every stored tensor's shape without reading one, which the loader checks the
        config against before it builds anything; None where the form checks its own
        (an HF folder, against its safetensors headers while reading the config)."""

    def tensors(self, path: Path, cfg: ModelConfig) -> Iterable[tuple[str, torch.Tensor | Pieces]]:
        """The (name, tensor or Pieces) pairs one at a time
        (framework.checkpoint.checkpoint_tensors); a form that cannot (DCP: torch's
        reader fills a model) refuses in one line."""


def training_model_config(path: Path, metadata: dict[str, Any]) -> ModelConfig:
    """The ModelConfig a training checkpoint (Lightning file, DCP or ZeRO folder) keeps
    under ``checkpoint["layerdrop"]["model_config"]``."""
    entry = metadata.get(CKPT_KEY)
    entry = entry.get("model_config") if isinstance(entry, dict) else None
    if not isinstance(entry, dict):
        raise CheckpointError(f"checkpoint {str(path)!r} is not a layerdrop checkpoint "
                              f"(no {CKPT_KEY}.model_config entry)")
    return model_config_from(entry, path)


def model_config_from(entry: dict[str, Any], path: Path) -> ModelConfig:
    try:
        return ModelConfig.from_dict(entry)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{str(path)!r}: {err}") from None


def metadata_of(entries: Any, path: Path) -> dict[str, Any]:
    """A checkpoint dict without its tensors (refused when it is not a dict)."""
    if not isinstance(entries, dict):
        raise CheckpointError(f"checkpoint {str(path)!r} is not a layerdrop checkpoint (no metadata dict)")
    return {k: v for k, v in entries.items() if k not in TENSOR_ENTRIES}


def archive_reason(path: Path, named: bool = True) -> str | None:
    """None when the torch.save file ``path`` was written to the end, else what is wrong."""
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return f"{path.name + ' ' if named else ''}cut short at {path.stat().st_size} bytes"
    return None


def read_json(path: Path) -> dict:
    """A JSON object from ``path``; CheckpointError (one line) for anything else."""
    if not path.is_file():
        raise CheckpointError(f"{str(path)!r} does not exist")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        reason = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise CheckpointError(f"{str(path)!r} is not valid JSON: {reason}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{str(path)!r} is not a JSON object")
    return data


def first_line(err: BaseException) -> str:
    """The first line of a library's error message (its type when it says nothing)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def copy_into(decoder: nn.Module, tensors: Iterable[tuple[str, torch.Tensor | Pieces]], path: Path) -> None:
    """Copy (name, tensor or Pieces) pairs into the decoder's own tensors, one at a time,
    and refuse a checkpoint whose names or shapes differ from the decoder's, or whose
    weights are not finite. The one way weights enter a decoder, whether it was built to
    read the checkpoint (``Checkpoint.load_decoder``) or is a training run's, compiled,
    checkpoint-wrapped or sharded by FSDP2 (``model.init_from``): names are compared
    without the wrappers' segments, and a sharded tensor keeps its own shard of the full
    value every rank reads (no communication)."""
    targets = {plain_name(name): tensor for name, tensor in decoder.state_dict().items()}
    found, unexpected, non_finite = set(), [], []
    with torch.no_grad():
        for name, value in tensors:
            target = targets.get(name)
            if target is None:
                unexpected.append(name)
                continue
            shape = value.shape if isinstance(value, Pieces) else tuple(value.shape)
            check_shape(path, name, shape, target.shape)
            parts = value.parts if isinstance(value, Pieces) else [value]
            if any(part.is_floating_point() and not bool(torch.isfinite(part).all()) for part in parts):
                non_finite.append(name)
            _write(target, value)
            found.add(name)
    check_names(path, [n for n in targets if n not in found], unexpected)
    if non_finite:  # eval on NaN/Inf weights prints NaN for every metric and exits 0
        raise _non_finite(path, non_finite)


def _write(target: torch.Tensor, value: torch.Tensor | Pieces) -> None:
    if type(target) is not torch.Tensor and _is_dtensor(target):  # FSDP2: this rank's shard of the full value
        from torch.distributed.tensor import distribute_tensor

        if isinstance(value, Pieces):
            value = torch.cat([part.reshape(-1) for part in value.parts]).view(value.shape)
        full = value.to(target.device, target.dtype)
        target.copy_(distribute_tensor(full, target.device_mesh, target.placements, src_data_rank=None))
    elif isinstance(value, Pieces):  # copied into place piece by piece, never assembled
        flat, offset = target.view(-1), 0
        for part in value.parts:
            flat[offset:offset + part.numel()].copy_(part)
            offset += part.numel()
    else:
        target.copy_(value)


def _is_dtensor(tensor: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor  # only for a tensor that is not a plain one

    return isinstance(tensor, DTensor)


def refuse_non_finite(decoder: nn.Module, path: Path) -> None:
    """The non-finite check of ``copy_into``, for a form whose library fills the decoder
    itself (DCP)."""
    bad = [name for name, tensor in decoder.state_dict().items()
           if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
    if bad:
        raise _non_finite(path, bad)


def _non_finite(path: Path, names: list[str]) -> CheckpointError:
    return CheckpointError(f"checkpoint {str(path)!r} holds non-finite weights ({len(names)} tensors, the first "
                           f"{names[0]}): the run diverged before it was saved; use an earlier checkpoint")


def check_shape(path: Path, name: str, stored: Any, wanted: Any) -> None:
    if not isinstance(stored, (tuple, list, torch.Size)) or list(stored) != list(wanted):
        shown = list(stored) if isinstance(stored, (tuple, list, torch.Size)) else stored
        raise CheckpointError(f"checkpoint {str(path)!r} does not match its config: {name} has shape "
                              f"{shown} in the checkpoint, {list(wanted)} in the model")


def check_names(path: Path, missing: list[str], unexpected: list[str]) -> None:
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {str(path)!r} does not match its config: "
                              f"missing {missing[:5]}, unexpected {unexpected[:5]}")


__all__ = ["CKPT_KEY", "MODEL_PREFIX", "WEIGHTS_FILE", "CONFIG_FILE", "TOKENIZER_FILE", "CheckpointError", "Pieces",
           "Form", "TENSOR_ENTRIES", "metadata_of", "archive_reason", "training_model_config", "model_config_from",
           "read_json", "first_line", "copy_into", "refuse_non_finite", "check_shape", "check_names"]
