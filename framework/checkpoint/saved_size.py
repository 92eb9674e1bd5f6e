"""How many bytes a checkpoint will take on disk, known before it is written, so that a
save that cannot fit is refused before it starts (framework/files/disk_space.py's
``check_room``) and a save that fails says how much room it needed.

    torch_save_bytes(obj)                 the exact length of the file ``torch.save`` writes for obj
    dcp_part_bytes(state, replicated=...) this rank's share of a DCP folder (FSDP2)

Counting tensors alone fell short: a single file adds its pickle, zip headers and
64-byte alignment (~5% on a small model), and a DCP folder writes every tensor and
every non-tensor value as an archive of its own (~1.5 KB each) plus a ``.metadata``
index (~200 bytes an entry): a tiny model's shards took 47% more than its tensors.

``torch_save_bytes`` runs torch's own writer under ``torch.serialization.skip_data``
into a sink that only counts: the pickle and every header are produced, the tensor
bytes are skipped (a seek), so the length is exact and no tensor is read or copied.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from typing import Any

import torch
# torch's writer as imported, not whatever ``torch.save`` is rebound to later: a wrapper that
# watches the writes (the crash tests' kill points) must not see this count as one.
from torch.serialization import save as _torch_save

# .metadata (DCP's index, pickled by rank 0) per stored item: ~160 bytes and its dotted
# name twice, measured on this project's FSDP2 folders (434 items, 110,686 bytes); the
# allowance below is half as much again.
DCP_INDEX_BYTES_PER_ITEM = 240


class _CountingSink(io.RawIOBase):
    """A writable, seekable file that keeps nothing: its length is the furthest byte reached."""

    def __init__(self) -> None:
        self.position = 0
        self.length = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        self.position += size
        self.length = max(self.length, self.position)
        return size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        self.position = base + offset
        self.length = max(self.length, self.position)  # skip_data seeks over a tensor's bytes
        return self.position

    def tell(self) -> int:
        return self.position


def torch_save_bytes(obj: Any) -> int:
    """The length of the file ``torch.save`` writes for ``obj`` into a handle (an open file, as
    AtomicCheckpointIO and the FSDP2 strategy write theirs)."""
    sink = _CountingSink()
    with torch.serialization.skip_data():
        _torch_save(obj, sink)
    return sink.length


def dcp_part_bytes(state: dict[str, Any], *, replicated: bool) -> tuple[int, int]:
    """(bytes, index bytes): what ``torch.distributed.checkpoint.save`` of ``state`` writes for
    this rank, the way torch's FileSystemWriter does: every tensor (a DTensor's local
    shard) as ``torch.save`` of a compact tensor, every other value as ``torch.save`` of
    it, one after another in the rank's file; the index bytes are its allowance in
    ``.metadata``. DCP writes a value held alike by several ranks once: one that is not a
    DTensor is counted only where ``replicated`` (global rank 0), a DTensor shard that HSDP
    replicates only on its first replica."""
    data = index = 0
    for name, value in _items(state, ""):
        local = getattr(value, "to_local", None)
        if not (_first_replica(value) if local is not None else replicated):
            continue
        if isinstance(value, torch.Tensor):
            tensor = local() if local is not None else value
            data += torch_save_bytes(_as_written(tensor))
        else:
            data += torch_save_bytes(value)
        index += DCP_INDEX_BYTES_PER_ITEM + 2 * len(name)
    return data, index


def _first_replica(dtensor: Any) -> bool:
    """Whether this rank holds the first copy of its shard of ``dtensor`` (index 0 along
    every mesh dimension the tensor is replicated over)."""
    coordinate = dtensor.device_mesh.get_coordinate()
    return coordinate is None or all(index == 0 for index, placement in zip(coordinate, dtensor.placements)
                                     if placement.is_replicate())


def _as_written(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor DCP hands to ``torch.save``: on the CPU and no larger than itself (a view
    into a bigger storage, e.g. FSDP2's padded shard, is cloned first). A stand-in of
    the same shape and dtype when it is not so already: torch.empty touches no memory,
    and skip_data never reads it."""
    if tensor.device.type == "cpu" and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size():
        return tensor
    return torch.empty(tensor.shape, dtype=tensor.dtype)


def _items(value: Any, name: str) -> Iterable[tuple[str, Any]]:
    """The (dotted name, value) items DCP stores, as its ``traverse_state_dict`` finds
    them: mappings are walked, and lists holding a tensor or a mapping; anything else
    (a tuple, a list of numbers) is one value."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield from _items(item, f"{name}.{key}" if name else str(key))
    elif isinstance(value, list) and not _one_value(value):
        for index, item in enumerate(value):
            yield from _items(item, f"{name}.{index}")
    else:
        yield name, value


def _one_value(value: list) -> bool:
    return not any(isinstance(item, (torch.Tensor, Mapping)) or (isinstance(item, list) and not _one_value(item))
                   for item in value)


__all__ = ["torch_save_bytes", "dcp_part_bytes", "DCP_INDEX_BYTES_PER_ITEM"]
