"""Preallocated per-layer key/value cache for incremental decoding.

One shared ``length`` for all layers: a forward writes positions
[length, length + T) of every layer it runs, and the decoder advances ``length``
once the forward is done. A layer that the forward skipped keeps stale entries at
those positions; self-speculative decoding relies on the verify pass, which runs
every layer from the pre-draft length, to overwrite them, and on ``crop`` to drop
rejected draft positions (``crop_rows`` when each row keeps its own number of them).

Batches of prompts of different lengths are left-padded: ``padding`` marks, per row,
the positions that hold no token, and the attention bias keeps every query away from
them. ALiBi needs nothing else: its bias depends on the distance between a query and a
key, which padding on the left does not change.

``extra_layers`` slots after the model's own layers hold the K/V of exit adapters
(their blocks are numbered ``n_layers + i``).
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layers: int, batch_size: int, n_heads: int, head_dim: int,
                 max_len: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        shape = (batch_size, n_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.padding = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)
        self.padded = False  # any padding at all: without it the bias broadcasts over rows
        self.max_len = max_len
        self.batch_size = batch_size
        self.length = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k/v [B, H, T, D] at the current position; return the layer's [0, length+T)."""
        if k.shape[0] != self.batch_size:
            raise ValueError(f"KV cache batch size mismatch: got {k.shape[0]} rows, the cache holds {self.batch_size}")
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: length {end} > max_len={self.max_len}")
        self.keys[layer][:, :, self.length:end] = k
        self.values[layer][:, :, self.length:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def mark_padding(self, padding: torch.Tensor) -> None:
        """Record which of the next T positions are padding (``padding`` [B, T], True = no token)."""
        if padding.shape[0] != self.batch_size:
            raise ValueError(f"padding has {padding.shape[0]} rows, the cache holds {self.batch_size}")
        end = self.length + padding.shape[1]
        if end > self.max_len:
            raise ValueError(f"KV cache overflow: length {end} > max_len={self.max_len}")
        self.padding[:, self.length:end] = padding
        self.padded = self.padded or bool(padding.any())

    def key_padding(self, end: int) -> torch.Tensor | None:
        """[B, end] padding of the keys a forward ending at ``end`` attends to, or None."""
        return self.padding[:, :end] if self.padded else None

    def advance(self, num_tokens: int) -> None:
        if not 0 <= self.length + num_tokens <= self.max_len:
            raise ValueError(f"KV cache overflow: length {self.length + num_tokens} > max_len={self.max_len}")
        self.length += num_tokens

    def crop(self, length: int) -> None:
        """Forget every position from ``length`` on (rejected draft tokens)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"crop length={length} is invalid: must be in [0, {self.length}]")
        self.padding[:, length:] = False  # a position written again holds a token unless marked
        self.length = length

    def crop_rows(self, lengths: list[int]) -> None:
        """Row r keeps its first ``lengths[r]`` positions (each row its own accepted
        draft prefix). The rows stay one block: a shorter row moves right so that every
        row ends at the longest one's end, the positions it leaves becoming left padding
        (ALiBi sees distances only, which moving a whole row leaves alone), and the
        padding every row has at its left is dropped, so the length is what the longest
        row needs."""
        if len(lengths) != self.batch_size or not all(0 <= n <= self.length for n in lengths):
            raise ValueError(f"crop lengths {lengths} are invalid: one per row ({self.batch_size}), each in "
                             f"[0, {self.length}]")
        end = max(lengths)
        device = self.padding.device
        shift = end - torch.tensor(lengths, device=device)
        lead = self.padding[:, :end].int().cumprod(1).sum(1)  # each row's left padding now
        drop = int((shift + torch.minimum(lead, torch.tensor(lengths, device=device))).min())
        if not bool(shift.any()) and drop == 0:
            self.crop(end)
            return
        source = torch.arange(drop, end, device=device)[None, :] - shift[:, None]  # [B, end - drop]
        vacated = source < 0
        source = source.clamp_min(0)
        for store in (self.keys, self.values):
            for layer, tensor in enumerate(store):
                index = source[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])
                store[layer][:, :, :end - drop] = tensor.gather(2, index)
        self.padding[:, :end - drop] = self.padding.gather(1, source) | vacated
        self.padded = self.padded or bool(vacated.any())
        self.crop(end - drop)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices, in the order given): finished sequences leave the batch."""
        rows = rows.to(self.padding.device)
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.padding = self.padding.index_select(0, rows)
        self.batch_size = int(rows.numel())
