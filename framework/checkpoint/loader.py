"""One checkpoint, opened once: ``Checkpoint.open(path)`` finds its form, proves it
harmless and reads its metadata; the config, the tokenizer and the decoder then come
from that one object, so a command reads each file of a checkpoint once or twice
instead of once per question.

    ckpt = Checkpoint.open("runs/x/checkpoints/last.ckpt")
    cfg = ckpt.model_config                 # no tensor read
    tokenizer = ckpt.find_tokenizer()
    decoder, cfg = ckpt.load_decoder()      # eval mode, on the CPU unless told

Loading never materialises optimizer state (files are memory-mapped and only model
tensors are read) and reads every pickled file by weights-only rules
(framework/checkpoint/safety.py): a checkpoint handed over by someone else cannot run
code. A config that does not match the stored shapes is refused before a model is
built, and the model is built on the meta device, then given storage once; a
checkpoint with non-finite weights is refused.

The functions below (``load_decoder``, ``read_model_config``, ...) take a path or an
opened Checkpoint; a command that asks more than one question opens it once and asks the
Checkpoint.
"""

from __future__ import annotations

import os
from functools import cached_property
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from framework.checkpoint.base import Form, refuse_non_finite
from framework.checkpoint.forms import form_of
from framework.checkpoint.tokenizer_record import find_tokenizer_of, record_of
from framework.config import ModelConfig
from framework.checkpoint.shape_check import check_config_against, meta_decoder
from framework.model.decoder import Decoder


class Checkpoint:
    """A checkpoint of any form, proven harmless, with its metadata read."""

    def __init__(self, path: Path, form: Form, metadata: dict[str, Any]) -> None:
        self.path, self.form, self.metadata = path, form, metadata

    @classmethod
    def open(cls, path: str | os.PathLike | Checkpoint) -> Checkpoint:
        if isinstance(path, Checkpoint):
            return path
        path = Path(path)
        form = form_of(path).open(path)
        return cls(path, form, form.metadata(path))

    @cached_property
    def model_config(self) -> ModelConfig:
        return self.form.model_config(self.path, self.metadata)

    def tokenizer_record(self) -> dict[str, Any]:
        """The recorded tokenizer entry ({file, sha256, vocab_size, eos_token, eos_id}), or {}."""
        return record_of(self.form, self.metadata)

    def find_tokenizer(self) -> Path:
        """tokenizer.json of this checkpoint (see framework/checkpoint/tokenizer_record.py)."""
        return find_tokenizer_of(self.path, self.form, self.metadata)

    def checked_config(self) -> ModelConfig:
        """The config, checked against the stored shapes where the form can list them
        without reading a tensor (before anything is built from it)."""
        cfg = self.model_config
        shapes = self.form.shapes(self.path)
        if shapes is not None:
            check_config_against(cfg, shapes, self.path)
        return cfg

    def load_decoder(self, map_location: str | torch.device = "cpu") -> tuple[Decoder, ModelConfig]:
        """A Decoder (eval mode) and its config. Memory: the decoder itself plus one
        tensor at a time (the files are mapped, not read whole)."""
        cfg = self.checked_config()
        decoder = meta_decoder(cfg).to_empty(device=map_location)
        decoder.reset_buffers()  # every weight is then read from the checkpoint (names checked)
        self.form.load_into(decoder, self.path)  # framework.checkpoint.base.copy_into: names, shapes, finite
        return decoder.eval(), cfg

    def tensors(self) -> Iterable[tuple[str, Any]]:
        """(name, tensor or Pieces) of the decoder, one at a time, after the checks
        ``load_decoder`` makes (every form but FSDP2's DCP folders, which torch's reader
        loads into a model directly): what ``copy_into`` takes."""
        return self.form.tensors(self.path, self.checked_config())


# ------------------------------------------------------------------ by path or opened


def checkpoint_form(path: str | os.PathLike) -> str:
    """Which form (``FORM_NAMES``) the file or folder at ``path`` is (a clear error otherwise)."""
    return form_of(path).name


def load_decoder(path: str | os.PathLike | Checkpoint, *,
                 map_location: str | torch.device = "cpu") -> tuple[Decoder, ModelConfig]:
    """A Decoder (eval mode) and its config from a checkpoint of any form. Raises
    CheckpointError (one line) for a checkpoint that could run code, does not match its
    config, or holds NaN/Inf weights."""
    return Checkpoint.open(path).load_decoder(map_location)


def read_model_config(path: str | os.PathLike | Checkpoint) -> ModelConfig:
    """The ModelConfig of a checkpoint of any form, without materialising weights;
    like load_decoder it refuses a checkpoint that could run code."""
    return Checkpoint.open(path).model_config


def read_metadata(path: str | os.PathLike | Checkpoint) -> dict[str, Any]:
    """A checkpoint's non-tensor entries: Lightning's checkpoint dict without the
    weights and optimizer state (``global_step``, ``layerdrop``, ``hyper_parameters``,
    ``datamodule_hyper_parameters``, ...); for an exported folder, its config.json.
    Read by weights-only rules; the rest of a folder is not walked."""
    if isinstance(path, Checkpoint):
        return path.metadata
    form = form_of(path)
    return form.metadata(Path(path))


def checkpoint_tensors(path: str | os.PathLike | Checkpoint) -> Iterable[tuple[str, Any]]:
    """``Checkpoint.tensors`` of a path or an opened Checkpoint."""
    return Checkpoint.open(path).tensors()


__all__ = ["Checkpoint", "check_config_against", "meta_decoder", "refuse_non_finite", "checkpoint_form", "load_decoder",
           "read_model_config", "read_metadata", "checkpoint_tensors"]
