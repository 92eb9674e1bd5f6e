"""A KV cache whose shapes never change, for decoding steps recorded as CUDA graphs.

``KVCache`` hands attention the keys up to its length, so every step has a new shape.
A CUDA graph replays fixed shapes at fixed addresses: here every forward attends to all
``max_len`` positions, the positions after its queries masked as future keys, and the
length lives on the device as a 0-d tensor (``position``) that the step itself reads to
place its K/V (``index_copy_``), its RoPE angles and its mask, and advances. So one graph
serves every cache length, and the tensors are marked static addresses: a graph writes
them in place instead of copying them in and out each call.

``length`` (the host's view, read by the bookkeeping between steps: cropping rejected
drafts, holes, compaction) is the tensor read back, a device sync; the compiled step never
reads it. ``crop`` takes the tensor too (``at``), so a verification inside a compiled
graph rewinds the cache without a Python integer that would specialise the graph.
"""

from __future__ import annotations

import torch

from framework.model.kv_cache import KVCache


class StaticKVCache(KVCache):
    static = True

    def __init__(self, n_layers: int, batch_size: int, n_heads: int, head_dim: int, max_len: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        self.position = torch.zeros((), dtype=torch.long, device=device)
        super().__init__(n_layers, batch_size, n_heads, head_dim, max_len, dtype=dtype, device=device)
        self._mark_static()

    @property
    def length(self) -> int:  # type: ignore[override]
        return int(self.position)

    @length.setter
    def length(self, value: int) -> None:
        self.position.fill_(value)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k/v [B, H, T, D] at positions length..length+T-1; return the layer's whole
        [B, H, max_len, D] (the mask keeps queries off the positions after them)."""
        # a compiled step checks nothing against the Python row count: it would pin the rows' symbol
        if not torch.compiler.is_compiling() and k.shape[0] != self.batch_size:
            raise ValueError(f"KV cache batch size mismatch: got {k.shape[0]} rows, the cache holds {self.batch_size}")
        index = self.position + torch.arange(k.shape[2], device=self.position.device)
        self.keys[layer].index_copy_(2, index, k)
        self.values[layer].index_copy_(2, index, v)
        return self.keys[layer], self.values[layer]

    def span(self, q_len: int) -> tuple[torch.Tensor, int]:
        return self.position, self.max_len

    def at(self, length: int) -> torch.Tensor:
        return torch.tensor(length, dtype=torch.long, device=self.position.device)

    def key_padding(self, end: int) -> torch.Tensor | None:
        return self.padding if self.padded else None

    def advance(self, num_tokens: int) -> None:
        # a compiled step cannot raise on a device value; outside one (eager steps, the
        # prefill) the overflow is caught here, and the caller sizes the cache for the rest
        if not torch.compiler.is_compiling():
            super().advance(num_tokens)
        else:
            self.position.add_(num_tokens)

    def crop(self, length: int | torch.Tensor) -> None:
        """Forget every position from ``length`` on; ``length`` an int, or inside a compiled
        step the tensor ``at`` made."""
        if not isinstance(length, torch.Tensor):
            return super().crop(length)
        kept = torch.arange(self.max_len, device=self.position.device) < length
        self.padding.logical_and_(kept[None, :])  # a position written again holds a token unless marked
        self.position.copy_(length)

    def select_rows(self, rows: torch.Tensor) -> None:
        super().select_rows(rows)
        self._mark_static()  # new tensors: a graph for the smaller batch records at their addresses

    def _mark_static(self) -> None:
        for tensor in (*self.keys, *self.values, self.padding, self.position):
            torch._dynamo.mark_static_address(tensor)
        # Fixed within a generation, but not across them: rows leave the batch, and the next
        # batch's prompts need another max_len. A compiled step is traced once for every row
        # count and length (on a GPU a CUDA graph is still recorded per shape, cheaply).
        for tensor in (*self.keys, *self.values, self.padding):
            torch._dynamo.maybe_mark_dynamic(tensor, 0)
            torch._dynamo.maybe_mark_dynamic(tensor, tensor.dim() - 2 if tensor.dim() == 4 else 1)


__all__ = ["StaticKVCache"]
