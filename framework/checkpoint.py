"""The on-disk forms of a trained decoder, and the one loader every command uses.

Four forms, each loadable in one process (CPU or GPU, no process group):

- ``lightning``: a single-file ``.ckpt`` (single device, DDP): the module's weights
  under ``state_dict`` with the prefix ``model.``, the ModelConfig as a plain dict
  under ``checkpoint["layerdrop"]["model_config"]``;
- ``dcp``: an FSDP2 folder written by Lightning's ModelParallelStrategy through
  torch.distributed.checkpoint (``.metadata``, ``__R_0.distcp`` shards, ``meta.pt``
  holding the non-tensor entries); see framework/distributed_checkpoint.py;
- ``deepspeed``: a ZeRO-2/ZeRO-3 folder written by Lightning's DeepSpeedStrategy
  (``latest``, ``<tag>/*_model_states.pt``, ``<tag>/*_optim_states.pt``); the fp32
  weights are consolidated from the optimizer files' flat partitions; see
  framework/zero_checkpoint.py;
- ``exported``: ``model.safetensors`` + ``config.json`` (+ ``tokenizer.json``), written
  by ``layerdrop export`` and at the end of every pretraining run (framework/export.py);
- ``hf``: a Hugging Face Llama folder (config.json with ``model_type``, safetensors
  only, sharded or not); see framework/hf_checkpoint.py.

Loading never materialises optimizer state (files are memory-mapped and only model
tensors are read) and reads every pickled file by weights-only rules
(framework/safe_unpickle.py): a checkpoint handed over by someone else cannot run
code. A checkpoint with non-finite weights is refused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from framework.config import ModelConfig
from framework.families import build_decoder
from framework.model import Decoder

CKPT_KEY = "layerdrop"
MODEL_PREFIX = "model."
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
FORMS = ("lightning", "exported", "hf", "dcp", "deepspeed")
_NON_TENSOR_EXCLUDED = ("state_dict", "optimizer_states", "module", "optimizer")


class CheckpointError(ValueError):
    """A checkpoint path or content that cannot be loaded; the message says why."""


def checkpoint_form(path: str | os.PathLike) -> str:
    """Which of FORMS the file or folder at ``path`` is (a clear error otherwise)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    if path.is_file():
        return "lightning"
    from framework.hf_checkpoint import is_hf_folder

    if is_hf_folder(path):
        return "hf"
    if (path / WEIGHTS_FILE).is_file() or (path / CONFIG_FILE).is_file():
        return "exported"
    if (path / ".metadata").is_file():
        return "dcp"
    if (path / "latest").is_file() or any(path.glob("*/*model_states.pt")):
        return "deepspeed"
    raise CheckpointError(f"{str(path)!r} is not a checkpoint: expected a .ckpt file, an exported folder "
                          f"({WEIGHTS_FILE} + {CONFIG_FILE}), a Hugging Face folder, an FSDP2 folder (.metadata + meta.pt) or a "
                          "DeepSpeed folder (latest + <tag>/*_states.pt)")


def load_decoder(path: str | os.PathLike, *, map_location: str | torch.device = "cpu") -> tuple[Decoder, ModelConfig]:
    """A Decoder (eval mode) and its config from a checkpoint of any form.

    Memory: the decoder itself plus one tensor at a time (the files are mapped, not
    read whole). Raises CheckpointError (one line) for a checkpoint that could run
    code, does not match its config, or holds NaN/Inf weights.
    """
    path = Path(path)
    model_cfg = read_model_config(path)  # also proves every pickled file harmless
    with torch.device("meta"):
        decoder = build_decoder(model_cfg)
    decoder = decoder.to_empty(device=map_location)
    decoder.reset_buffers()  # every weight is then read from the checkpoint (names checked)
    form = checkpoint_form(path)
    if form == "dcp":
        from framework.distributed_checkpoint import load_into

        load_into(decoder, path)
    else:
        copy_into(decoder, _tensors(form, path), path)
    refuse_non_finite(decoder, path)
    return decoder.eval(), model_cfg


def read_model_config(path: str | os.PathLike) -> ModelConfig:
    """The ModelConfig of a checkpoint of any form, without materialising weights;
    like load_decoder it refuses a checkpoint that could run code."""
    from framework.safe_unpickle import prove_checkpoint_harmless

    path = Path(path)
    form = checkpoint_form(path)
    if form == "hf":  # safetensors only: nothing is unpickled (a pickle-only folder is refused)
        from framework.hf_checkpoint import read_model_config as read_hf

        return read_hf(path)
    prove_checkpoint_harmless(path)
    if form == "exported":
        return _config_from(read_json(path / CONFIG_FILE), path)
    meta = read_metadata(path).get(CKPT_KEY)
    if not isinstance(meta, dict) or not isinstance(meta.get("model_config"), dict):
        raise CheckpointError(f"checkpoint {str(path)!r} is not a layerdrop checkpoint "
                              f"(no {CKPT_KEY}.model_config entry)")
    return _config_from({"model": meta["model_config"]}, path)


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint's non-tensor entries: Lightning's checkpoint dict without the
    weights and optimizer state (``global_step``, ``layerdrop``, ``hyper_parameters``,
    ``datamodule_hyper_parameters``, ...); for an exported folder, its config.json."""
    from framework.safe_unpickle import load_torch_file

    path = Path(path)
    form = checkpoint_form(path)
    if form in ("exported", "hf"):
        return read_json(path / CONFIG_FILE)
    if form == "lightning":
        entries = load_torch_file(path)
    elif form == "dcp":
        entries = load_torch_file(path / "meta.pt") if (path / "meta.pt").is_file() else None
    else:
        from framework.zero_checkpoint import model_states_file

        entries = load_torch_file(model_states_file(path), deepspeed=True)
    if not isinstance(entries, dict):
        raise CheckpointError(f"checkpoint {str(path)!r} is not a layerdrop checkpoint (no metadata dict)")
    return {k: v for k, v in entries.items() if k not in _NON_TENSOR_EXCLUDED}


def find_tokenizer(ckpt_path: str | os.PathLike) -> Path:
    """The tokenizer.json of a checkpoint of any form, from any working directory
    (see framework/checkpoint_tokenizer.py for where it looks)."""
    from framework.checkpoint_tokenizer import find_tokenizer as find

    return find(ckpt_path)


def export_decoder(decoder: Decoder, out_dir: str | os.PathLike, *, extra: dict | None = None,
                   overwrite: bool = False, tokenizer: str | os.PathLike | None = None) -> Path:
    """Write ``model.safetensors`` + ``config.json`` (+ tokenizer.json): see framework/export.py."""
    from framework.export import export_decoder as export

    return export(decoder, out_dir, extra=extra, overwrite=overwrite, tokenizer=tokenizer)


# ------------------------------------------------------------------ tensors per form


def checkpoint_tensors(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """(name, tensor or Pieces) of a checkpoint's decoder, one at a time (every form
    but FSDP2's DCP folders, which torch's reader loads into a model directly)."""
    path = Path(path)
    form = checkpoint_form(path)
    if form == "dcp":
        raise CheckpointError(f"{str(path)!r} is an FSDP2 checkpoint folder: export it first "
                              "(layerdrop export --ckpt ... --out DIR) and start from DIR")
    read_model_config(path)  # proves it harmless, checks its config
    return _tensors(form, path)


def _tensors(form: str, path: Path) -> Iterator[tuple[str, Any]]:
    if form == "lightning":
        from framework.safe_unpickle import load_torch_file

        state = load_torch_file(path).get("state_dict") or {}
        return ((k[len(MODEL_PREFIX):], v) for k, v in state.items() if k.startswith(MODEL_PREFIX))
    if form == "exported":
        return _exported_tensors(path / WEIGHTS_FILE)
    if form == "hf":
        from framework.hf_checkpoint import read_model_config as read_hf, read_tensors

        return read_tensors(path, read_hf(path))
    from framework.zero_checkpoint import read_zero_tensors

    return read_zero_tensors(path)


def _exported_tensors(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    if not file.is_file():
        raise CheckpointError(f"exported model folder {str(file.parent)!r} has no {WEIGHTS_FILE}")
    try:
        with safe_open(str(file), framework="pt") as handle:  # memory-mapped
            for name in handle.keys():
                yield name, handle.get_tensor(name)
    except CheckpointError:
        raise
    except Exception as err:  # safetensors raises its own error types on a corrupt file
        raise CheckpointError(f"{str(file)!r} cannot be read: {str(err).strip().splitlines()[0]}") from None


@dataclass
class Pieces:
    """A tensor of ``shape`` stored as 1-D pieces that follow each other (a ZeRO
    partition per rank): copied into place piece by piece, never assembled first."""

    shape: tuple[int, ...]
    parts: list[torch.Tensor]


def copy_into(decoder: Decoder, tensors: Iterable[tuple[str, torch.Tensor | Pieces]], path: Path) -> None:
    """Copy (name, tensor or Pieces) pairs into the decoder's own tensors, one at a
    time, and refuse a checkpoint whose names or shapes differ from its config."""
    targets = decoder.state_dict()
    found, unexpected = set(), []
    with torch.no_grad():
        for name, value in tensors:
            target = targets.get(name)
            if target is None:
                unexpected.append(name)
                continue
            shape = value.shape if isinstance(value, Pieces) else tuple(value.shape)
            if tuple(shape) != tuple(target.shape):
                raise CheckpointError(f"checkpoint {str(path)!r} does not match its config: {name} has shape "
                                      f"{list(shape)} in the checkpoint, {list(target.shape)} in the model")
            if isinstance(value, Pieces):
                flat, offset = target.view(-1), 0
                for part in value.parts:
                    flat[offset:offset + part.numel()].copy_(part)
                    offset += part.numel()
            else:
                target.copy_(value)
            found.add(name)
    check_names(path, [n for n in targets if n not in found], unexpected)


def check_names(path: Path, missing: list[str], unexpected: list[str]) -> None:
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {str(path)!r} does not match its config: "
                              f"missing {missing[:5]}, unexpected {unexpected[:5]}")


def refuse_non_finite(decoder: Decoder, path: Path) -> None:
    """Eval on NaN/Inf weights prints NaN for every metric and exits 0: refuse instead."""
    bad = [name for name, tensor in decoder.state_dict().items()
           if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]
    if bad:
        raise CheckpointError(f"checkpoint {str(path)!r} holds non-finite weights ({len(bad)} tensors, the first "
                              f"{bad[0]}): the run diverged before it was saved; use an earlier checkpoint")


# ------------------------------------------------------------------ config helpers


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{str(path)!r} does not exist")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{str(path)!r} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{str(path)!r} is not a JSON object")
    return data


def _config_from(data: dict, path: Path) -> ModelConfig:
    if not isinstance(data.get("model"), dict):
        raise CheckpointError(f"{str(path)!r}: config has no 'model' section")
    try:
        return ModelConfig.from_dict(data["model"])
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{str(path)!r}: {err}") from None


__all__ = ["CheckpointError", "checkpoint_form", "checkpoint_tensors", "load_decoder", "read_model_config", "read_metadata",
           "find_tokenizer", "export_decoder", "CKPT_KEY", "WEIGHTS_FILE", "CONFIG_FILE", "TOKENIZER_FILE"]
