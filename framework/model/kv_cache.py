"""Preallocated per-layer key/value cache for incremental decoding.

One shared ``length`` for all layers: a forward writes positions
[length, length + T) of every layer it runs, and the decoder advances ``length``
once the forward is done. A layer that the forward skipped keeps stale entries at
those positions; self-speculative decoding relies on the verify pass, which runs
every layer from the pre-draft length, to overwrite them, and on ``crop`` to drop
rejected draft positions (``crop_rows`` when each row keeps its own number of them:
the positions a row drops below the longest row's end become holes, marked as padding).

Batches of prompts of different lengths are left-padded: ``padding`` marks, per row,
the positions that hold no token, and the attention bias keeps every query away from
them. Positions count a row's tokens only, for RoPE's angles and ALiBi's distances
alike, so padding anywhere in a row (at its left, or holes) changes nothing it computes.

``extra_layers`` slots after the model's own layers hold the K/V of exit adapters
(their blocks are numbered ``n_layers + i``).
"""

from __future__ import annotations

import torch


class KVCache:
    static = False  # StaticKVCache: every shape fixed, the length a tensor (framework/model/static_kv_cache.py)

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
        self.compactions = 0  # ``compact`` calls that moved anything

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

    def span(self, q_len: int) -> tuple[torch.Tensor | None, int]:
        """Where ``q_len`` new queries sit among the keys they attend to: (None, k_len), the
        queries being the last q_len of the k_len positions up to the cache's end."""
        return None, self.length + q_len

    def at(self, length: int) -> int:
        """``length`` as ``crop`` takes it inside a compiled step (an int here: dynamic shapes
        make it a symbol)."""
        return length

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

    def crop_rows(self, lengths: list[int], *, room: int = 0) -> None:
        """Row r keeps its first ``lengths[r]`` positions (each row its own accepted
        draft prefix). The rows stay one block ending at the longest one's end: a
        shorter row's positions from its own length on become holes, marked as padding,
        which attention skips and positions do not count (RoPE numbers a row's tokens,
        ALiBi measures distances in them). Nothing moves, which is what makes a round
        cheap; when fewer than ``room`` positions would be left free, ``compact`` closes
        the holes."""
        if len(lengths) != self.batch_size or not all(0 <= n <= self.length for n in lengths):
            raise ValueError(f"crop lengths {lengths} are invalid: one per row ({self.batch_size}), each in "
                             f"[0, {self.length}]")
        end = max(lengths)
        if min(lengths) < end:
            kept = torch.tensor(lengths, device=self.padding.device)
            holes = torch.arange(end, device=kept.device)[None, :] >= kept[:, None]
            self.padding[:, :end] |= holes
            self.padded = True
        self.crop(end)
        if self.max_len - self.length < room:
            self.compact()

    def compact(self) -> None:
        """Move each row's tokens right, in order, so that all its padding (left padding
        and holes) lies at its left, then drop the padding every row has at its left:
        the length becomes what the row with the most tokens needs."""
        end = self.length
        padding = self.padding[:, :end]
        # a stable sort on "is a token" puts a row's padding first and keeps its tokens' order
        source = torch.sort((~padding).to(torch.uint8), dim=1, stable=True).indices
        drop = int(padding.sum(1).min())
        source = source[:, drop:]
        if drop == 0 and bool((source == torch.arange(end, device=source.device)).all()):
            return
        for store in (self.keys, self.values):
            for layer, tensor in enumerate(store):
                index = source[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])
                store[layer][:, :, :end - drop] = tensor.gather(2, index)
        self.padding[:, :end - drop] = padding.gather(1, source)
        self.crop(end - drop)
        self.compactions += 1

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (indices, in the order given): finished sequences leave the batch."""
        rows = rows.to(self.padding.device)
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.padding = self.padding.index_select(0, rows)
        self.batch_size = int(rows.numel())
