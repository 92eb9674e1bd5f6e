"""Writing a safetensors file one tensor at a time.

The safetensors library writes only from a complete in-memory dict (and copies every
tensor to bytes first): that would hold an 8.2B model twice on the rank that writes
it. The format is the library's (an 8-byte little-endian header length, a JSON header
of names, dtypes, shapes and byte offsets, then the raw little-endian data); files
are read back with the library.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import torch

from contextlib import ExitStack

from framework.files.atomic_write import replacing
from framework.checkpoint.base import CheckpointError

_DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                torch.bool: "BOOL"}


class SafetensorsWriter:
    """Writes a safetensors file one tensor at a time, in the order of ``specs``
    ((name, dtype, shape) known up front); the file appears under its name only when
    complete (framework/files/atomic_write.py: a hidden partial file, fsynced, renamed)."""

    def __init__(self, path: str | os.PathLike, specs: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> None:
        self.path = Path(path)
        self.specs = list(specs)
        self._next = 0
        self._stack = ExitStack()
        self._handle: Any = None

    def __enter__(self) -> SafetensorsWriter:
        header, offset = {}, 0
        for name, dtype, shape in self.specs:
            if dtype not in _DTYPE_NAMES:
                raise CheckpointError(f"{name}: dtype {dtype} cannot be written to safetensors")
            size = _numel(shape) * torch.empty((), dtype=dtype).element_size()
            header[name] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        header["__metadata__"] = {"format": "pt"}
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as the library writes it
        partial = self._stack.enter_context(replacing(self.path))
        self._handle = self._stack.enter_context(open(partial, "wb"))
        self._handle.write(struct.pack("<Q", len(encoded)) + encoded)
        return self

    def write(self, name: str, tensor: torch.Tensor) -> None:
        expected, dtype, shape = self.specs[self._next]
        if name != expected or tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
            raise CheckpointError(f"safetensors writer: got {name} {tensor.dtype} {list(tensor.shape)}, "
                                  f"expected {expected} {dtype} {list(shape)}")
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        self._handle.write(memoryview(data.view(torch.uint8).numpy()))
        self._next += 1

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        if kind is None and self._next != len(self.specs):
            kind = CheckpointError
            error = CheckpointError(f"safetensors writer: {len(self.specs) - self._next} tensors were not written")
        if kind is None:
            self._stack.close()  # the file closed, fsynced and renamed into place
            return
        self._stack.__exit__(kind, error, traceback)  # the partial file removed
        if isinstance(error, CheckpointError):
            raise error


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count


__all__ = ["SafetensorsWriter"]
