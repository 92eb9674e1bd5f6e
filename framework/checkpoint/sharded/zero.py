"""The ``deepspeed`` form: a DeepSpeed ZeRO-2/ZeRO-3 checkpoint folder, read in one process.

Lightning's DeepSpeedStrategy writes (deepspeed 0.19.8)::

    last.ckpt/latest                                   the tag: "checkpoint"
    last.ckpt/checkpoint/mp_rank_00_model_states.pt    ZeRO-2: the module + Lightning's entries
    last.ckpt/checkpoint/zero_pp_rank_R_mp_rank_00_model_states.pt   ZeRO-3 (one per rank)
    last.ckpt/checkpoint/zero_pp_rank_R_mp_rank_00_optim_states.pt   one per rank

The trained fp32 weights live in the optimizer files as flat partitions:

- ZeRO-2: ``single_partition_of_fp32_groups[g]`` of rank R is the R-th slice of
  parameter group g's flat vector; the group's parameters follow each other in that
  vector in ``param_shapes[g]`` order, each followed by its ``param_alignment_paddings``;
- ZeRO-3: every parameter is split into ``ceil(numel / world)`` elements per rank
  (the last rank's part padded); rank R's ``fp32_flat_groups`` hold its parts of all
  parameters back to back, in ``param_shapes`` order across the groups.

DeepSpeed's own ``zero_to_fp32`` does the same consolidation but unpickles every file
with ``weights_only=False`` (a checkpoint could run code), needs DeepSpeed installed
and keeps the merged flat groups in memory next to the result. Here the files are
read by weights-only rules and memory-mapped, each parameter is copied out of the
partitions on its own, and the optimizer's moments (``base_optimizer_state`` /
``optimizer_state_dict``) are never touched: memory is the consolidated model. Before
any model is built, the recorded config is checked against ``param_shapes`` (the loader's
shared check) and every shape against what the partitions hold.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from framework.checkpoint.base import (MODEL_PREFIX, CheckpointError, Pieces, archive_reason, copy_into, metadata_of,
                                       training_model_config)
from framework.checkpoint.safety import LibraryObject, load_torch_file, prove_checkpoint_harmless

_OPTIM_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")


class ZeroFolder:
    name = "deepspeed"
    described = "a DeepSpeed folder (latest + <tag>/*_states.pt)"
    self_contained = False

    def detect(self, path: Path) -> bool:
        return (path / "latest").is_file() or any(path.glob("*/*model_states.pt"))

    def incomplete_reason(self, path: Path) -> str | None:
        """Complete: the ``latest`` tag (DeepSpeed's loader needs it), its folder, the
        model states and one optimizer file per rank, each a whole archive."""
        if not (path / "latest").is_file():
            return "no 'latest' file"
        try:
            folder = tag_folder(path)
            model_states_file(path)
        except CheckpointError as err:
            return str(err)
        ranks = sorted(int(m[1]) for entry in folder.iterdir() if (m := _OPTIM_FILE.match(entry.name)))
        if not ranks or ranks != list(range(len(ranks))):
            return f"optimizer state files of ranks {ranks} (expected 0..n-1)"
        return next((reason for entry in sorted(folder.glob("*.pt")) if (reason := archive_reason(entry))), None)

    def prove_harmless(self, path: Path) -> None:
        prove_checkpoint_harmless(path)

    def open(self, path: Path) -> ZeroFolder:
        self.prove_harmless(path)
        return self

    def metadata(self, path: Path) -> dict[str, Any]:
        return metadata_of(load_torch_file(model_states_file(path), deepspeed=True), path)

    def model_config(self, path: Path, metadata: dict[str, Any]) -> Any:
        return training_model_config(path, metadata)

    def shapes(self, path: Path) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape, each checked to be held whole by the partitions (a
        recorded shape the files cannot fill is refused here): no tensor is read."""
        return {name: tuple(value.shape) for name, value in read_zero_tensors(path)}

    def tensors(self, path: Path, cfg: Any) -> Iterator[tuple[str, torch.Tensor | Pieces]]:
        return read_zero_tensors(path)

    def load_into(self, decoder: Any, path: Path) -> None:
        copy_into(decoder, read_zero_tensors(path), path)


def tag_folder(path: Path) -> Path:
    """The folder of the checkpoint's tag (named by ``latest``, else the only one)."""
    latest = path / "latest"
    if latest.is_file():
        tag = latest.read_text(errors="replace").strip()
        if not re.fullmatch(r"[\w.\-]+", tag) or tag in (".", "..") or not (path / tag).is_dir():
            raise CheckpointError(f"{str(latest)!r} names tag {tag[:80]!r}, which is not a folder inside the checkpoint")
        return path / tag
    tags = sorted({p.parent for p in path.glob("*/*model_states.pt")})
    if len(tags) != 1:
        raise CheckpointError(f"DeepSpeed checkpoint {str(path)!r} has no 'latest' file and {len(tags)} tag folders")
    return tags[0]


def model_states_file(path: Path) -> Path:
    """Rank 0's model-states file: DeepSpeed's records and Lightning's entries."""
    folder = tag_folder(path)
    for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        if (folder / name).is_file():
            return folder / name
    raise CheckpointError(f"DeepSpeed checkpoint {str(path)!r} has no model-states file in {str(folder)!r}")


def _optimizer_files(folder: Path) -> list[Path]:
    ranked = []
    for file in folder.iterdir():
        match = _OPTIM_FILE.match(file.name)
        if match:
            if match.group(2) != "00":
                raise CheckpointError(f"{str(file)!r}: tensor/pipeline-parallel DeepSpeed checkpoints are not supported")
            ranked.append((int(match.group(1)), file))
    ranked.sort()
    if not ranked or [rank for rank, _ in ranked] != list(range(len(ranked))):
        raise CheckpointError(f"DeepSpeed checkpoint folder {str(folder)!r} lacks optimizer files of ranks "
                              f"0..N-1 (found ranks {[rank for rank, _ in ranked]})")
    return [file for _, file in ranked]


def _as_int(value: Any) -> int:
    return int(value.value) if isinstance(value, LibraryObject) else int(value)


def read_zero_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor | Pieces]]:
    """(decoder tensor name, tensor or Pieces) of every parameter and buffer, one at a
    time: views of the memory-mapped files, read only when copied into place."""
    states = load_torch_file(model_states_file(path), deepspeed=True)
    if states.get("frozen_param_shapes") or states.get("shared_params"):
        raise CheckpointError(f"DeepSpeed checkpoint {str(path)!r} has frozen or shared parameters, which a "
                              "layerdrop decoder never has")
    files = _optimizer_files(tag_folder(path))
    optimizers = [load_torch_file(file, deepspeed=True)["optimizer_state_dict"] for file in files]
    stage = _as_int(optimizers[0]["zero_stage"])
    world = max(_as_int(c) for c in (optimizers[0]["partition_count"] if isinstance(
        optimizers[0]["partition_count"], list) else [optimizers[0]["partition_count"]]))
    if world != len(files):
        raise CheckpointError(f"DeepSpeed checkpoint {str(path)!r} was written by {world} ranks but holds "
                              f"{len(files)} optimizer files")
    module = states.get("module") or {}
    for name in states.get("buffer_names") or []:
        if not isinstance(module.get(name), torch.Tensor):
            raise CheckpointError(f"DeepSpeed checkpoint {str(path)!r} lists buffer {str(name)[:80]!r} but holds no "
                                  "tensor for it")
        yield _decoder_name(name), module[name]
    param_shapes = _param_shapes(states.get("param_shapes"), path)
    if stage <= 2:
        yield from _zero2(param_shapes, optimizers, path)
    elif stage == 3:
        yield from _zero3(param_shapes, optimizers, world, path)
    else:
        raise CheckpointError(f"DeepSpeed checkpoint {str(path)!r} has ZeRO stage {stage}; stages 1-3 are read")


def _param_shapes(groups: Any, path: Path) -> list[dict[str, tuple[int, ...]]]:
    """``param_shapes``: per parameter group, name -> shape; refused unless every shape
    is a list of sizes >= 0 (the sizes say how much of the partitions each one takes)."""
    if not isinstance(groups, list) or not all(isinstance(group, dict) for group in groups):
        raise CheckpointError(f"DeepSpeed checkpoint {str(path)!r} has no param_shapes list (one mapping per "
                              "parameter group)")
    checked = []
    for group in groups:
        for name, shape in group.items():
            if not isinstance(shape, (tuple, list, torch.Size)) or not all(
                    isinstance(size, int) and size >= 0 for size in shape):
                raise CheckpointError(f"DeepSpeed checkpoint {str(path)!r}: parameter {str(name)[:80]!r} has shape "
                                      f"{str(shape)[:80]}, not a list of sizes >= 0")
        checked.append({name: tuple(shape) for name, shape in group.items()})
    return checked


def _zero2(param_shapes: list[dict], optimizers: list[dict], path: Path) -> Iterator[tuple[str, Pieces]]:
    paddings = optimizers[0].get("param_alignment_paddings")
    for group, shapes in enumerate(param_shapes):
        parts = [o["single_partition_of_fp32_groups"][group] for o in optimizers]  # rank order
        offset = 0
        for index, (name, shape) in enumerate(shapes.items()):
            numel = math.prod(shape)
            yield _decoder_name(name), Pieces(tuple(shape), _span(parts, offset, numel, path))
            offset += numel + (paddings[group][index] if paddings else 0)


def _zero3(param_shapes: list[dict], optimizers: list[dict], world: int,
           path: Path) -> Iterator[tuple[str, Pieces]]:
    per_rank = [o["fp32_flat_groups"] for o in optimizers]
    offset = 0
    for shapes in param_shapes:
        for name, shape in shapes.items():
            numel = math.prod(shape)
            part = math.ceil(numel / world)
            pieces = [piece for groups in per_rank for piece in _span(groups, offset, part, path)]
            yield _decoder_name(name), Pieces(tuple(shape), _truncated(pieces, numel))
            offset += part


def _span(parts: list[torch.Tensor], start: int, length: int, path: Path) -> list[torch.Tensor]:
    """Elements [start, start + length) of the concatenation of ``parts`` (1-D,
    memory-mapped), as views: nothing is read until they are copied."""
    pieces, base = [], 0
    for part in parts:
        end = base + part.numel()
        if end > start and base < start + length:
            pieces.append(part[max(start - base, 0):min(start + length - base, part.numel())])
        base = end
    if sum(p.numel() for p in pieces) != length:
        raise CheckpointError(f"DeepSpeed checkpoint {str(path)!r}: the optimizer files hold fewer fp32 weights "
                              "than its parameter shapes need (a truncated or mismatched checkpoint)")
    return pieces


def _truncated(pieces: list[torch.Tensor], numel: int) -> list[torch.Tensor]:
    """The pieces without the last rank's padding past ``numel`` elements."""
    kept, total = [], 0
    for piece in pieces:
        if total >= numel:
            break
        kept.append(piece[:numel - total])
        total += kept[-1].numel()
    return kept


def _decoder_name(name: str) -> str:
    return name[len(MODEL_PREFIX):] if name.startswith(MODEL_PREFIX) else name


__all__ = ["ZeroFolder", "read_zero_tensors", "model_states_file", "tag_folder"]
