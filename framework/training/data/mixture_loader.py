"""Batches of a weighted mixture: each row's source drawn with the weights, each source
streamed by its own litdata ``StreamingDataLoader``; resumes exactly with any number of
loader workers.

Why not litdata's ``CombinedStreamingDataset`` (which draws per sample the same way): its
state keeps one count of samples per source, and with loader workers litdata replays that
count as if the workers had taken a source's samples in turn, batch by batch. They do not
(each worker draws its own sources), so a resume with 2 workers served some blocks twice and
skipped others (measured on the suite's data: 2 of 20 rows repeated after 5 batches). Here
each source is a single-source loader, whose resume litdata gets right with any workers
(tests/training/data/test_data_module.py), the draw of row sources is a pure function of (seed, rank,
batch number), and the rows a source's loader served but no batch used yet are kept in the
state. So the next batch after a resume is the one the uninterrupted run would have drawn.

Each source cycles on its own: when one runs out it starts a new epoch (a new shuffle) while
the others go on, so a small source weighted up is repeated, as in any data mix; one "epoch"
of the mixture never ends (the run's length is trainer.max_steps).
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterator

import numpy as np
import torch
from litdata import StreamingDataLoader


def stack_collate(blocks: list[Any]) -> torch.Tensor:
    """Blocks of seq_len + 1 tokens -> int64 [B, seq_len + 1]."""
    return torch.from_numpy(np.stack([np.asarray(block) for block in blocks]).astype(np.int64))


BLOCK = 64  # batches drawn and filled at once: the per-batch cost is a slice, not a Python step per row


def uniforms(batch_size: int, seed: int, rank: int, block: int) -> np.ndarray:
    """[BLOCK, batch_size] uniforms in [0, 1) for batches ``block·BLOCK ...``: a pure function of
    (seed, rank, block), so a resumed run draws what the uninterrupted one would have and every
    rank draws its own."""
    return np.random.default_rng([seed, rank, block]).random((BLOCK, batch_size))


def draw_sources(weights: list[float], row_uniforms: np.ndarray) -> np.ndarray:
    """Each row's source: the weights' cumulative shares cut at the row's uniform (any weights,
    so a schedule's new weights apply from the next batch on the same uniforms)."""
    shares = np.cumsum(np.asarray(weights, dtype=np.float64))
    return np.minimum(np.searchsorted(shares / shares[-1], row_uniforms, side="right"), len(shares) - 1)


class MixtureLoader:
    """``(inputs, targets, sources)`` batches from several single-source loaders.

    ``loaders`` serve blocks of seq_len + 1 tokens (``stack_collate``) in batches of any size;
    ``weights`` are the sources' shares, or a function giving them for the next batch (a
    schedule of weights over the run's steps); ``sources`` is the int64 source index of each row.

    Rows are drawn and filled ``BLOCK`` batches at a time (a source's rows taken in the order
    per-batch draws would take them), so serving a batch is a slice. When the weights change
    inside a block, its unserved batches give their rows back and are drawn anew. The state is
    the block's start (each loader's state, the rows waiting) and its weights by batch: a resume
    refills the block as it was and serves from the same batch.
    """

    def __init__(self, loaders: list[StreamingDataLoader], weights: list[float] | Callable[[], list[float]],
                 batch_size: int, seed: int, rank: int = 0) -> None:
        self.loaders = loaders
        self.weights_now = weights if callable(weights) else (lambda fixed=list(weights): fixed)
        self.batch_size, self.seed, self.rank = batch_size, seed, rank
        self.batches = 0  # batches served: the next draw's number
        self._iterators: list[Iterator | None] = [None] * len(loaders)
        self._waiting: list[torch.Tensor | None] = [None] * len(loaders)  # rows a loader served, not yet in a block
        self._block: _Block | None = None
        self._replay: dict[str, Any] | None = None  # a loaded state's block, refilled at the next batch

    def __len__(self) -> int:
        # Never reached (the mixture cycles), but a length stops Lightning from fetching a
        # batch ahead, which would put a checkpoint's loader state one batch past training.
        return sys.maxsize

    def __iter__(self) -> MixtureLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        weights = self.weights_now()
        number, row = divmod(self.batches, BLOCK)
        if self._replay is not None:
            self._refill(self._replay)
            self._replay = None
        if self._block is None or self._block.number != number:
            self._start_block(number)
            self._fill(0, weights)
        elif self._block.segments[-1][1] != list(weights):
            self._fill(row, weights)
        block = self._block
        self.batches += 1
        return block.inputs[row], block.targets[row], block.sources[row]

    def _start_block(self, number: int, start: dict[str, Any] | None = None) -> None:
        if start is None:
            start = {"loaders": [loader.state_dict() for loader in self.loaders],
                     "waiting": [rows.tolist() if rows is not None else [] for rows in self._waiting]}
        self._block = _Block(number, uniforms(self.batch_size, self.seed, self.rank, number), start)

    def _fill(self, first: int, weights: list[float]) -> None:
        """Draws batches ``first...`` of the block with ``weights``; rows they held go back first."""
        block, weights = self._block, [float(weight) for weight in weights]
        if block.rows is not None:
            self._give_back(block, first)
        sources = torch.from_numpy(draw_sources(weights, block.uniforms[first:]).astype(np.int64))
        rows = None
        for source in torch.unique(sources).tolist():
            chosen = sources == source
            taken = self._take(source, int(chosen.sum()))
            if rows is None:
                rows = torch.empty((*sources.shape, taken.shape[1]), dtype=torch.int64)
            rows[chosen] = taken
        if block.rows is None:
            block.rows, block.sources = rows, sources
            block.inputs, block.targets = rows[:, :, :-1], rows[:, :, 1:]  # views: a batch is one index
        else:
            block.rows[first:], block.sources[first:] = rows, sources
        block.segments = [segment for segment in block.segments if segment[0] < first] + [(first, weights)]

    def _give_back(self, block: _Block, first: int) -> None:
        for source in range(len(self.loaders)):
            unserved = block.rows[first:][block.sources[first:] == source]
            if len(unserved):
                waiting = self._waiting[source]
                self._waiting[source] = unserved if waiting is None else torch.cat([unserved, waiting])

    def _take(self, source: int, count: int) -> torch.Tensor:
        """The next ``count`` rows of one source, from its loader (a new epoch of it when it runs out)."""
        waiting, served = self._waiting[source], []
        have = 0 if waiting is None else len(waiting)
        while have < count:
            served.append(self._next_batch(source))
            have += len(served[-1])
        if served:
            waiting = torch.cat(([] if waiting is None else [waiting]) + served)
        self._waiting[source] = waiting[count:]
        return waiting[:count]

    def _next_batch(self, source: int) -> torch.Tensor:
        for attempt in range(2):
            if self._iterators[source] is None:
                self._iterators[source] = iter(self.loaders[source])
            try:
                return next(self._iterators[source])
            except StopIteration:
                self._iterators[source] = None  # the next iter() starts the source's next epoch
        raise RuntimeError(f"source {source} of the mixture served no batch in a whole epoch")

    def _refill(self, saved: dict[str, Any]) -> None:
        """The saved block as the uninterrupted run filled it: the loaders and waiting rows at its
        start, then its weights' segments in order."""
        self._restore(saved["start"])
        self._start_block(int(saved["number"]), saved["start"])
        for first, weights in saved["segments"]:
            self._fill(int(first), [float(weight) for weight in weights])

    def _restore(self, start: dict[str, Any]) -> None:
        for loader, loader_state in zip(self.loaders, start["loaders"]):
            loader.load_state_dict(loader_state)
        self._iterators = [None] * len(self.loaders)
        self._waiting = [torch.tensor(rows, dtype=torch.int64) if rows else None for rows in start["waiting"]]

    def state_dict(self) -> dict[str, Any]:
        if self._replay is not None:
            return {"batches": self.batches, "block": self._replay}
        if self._block is None:
            return {"batches": self.batches, "block": None,
                    "loaders": [loader.state_dict() for loader in self.loaders],
                    "waiting": [rows.tolist() if rows is not None else [] for rows in self._waiting]}
        block = self._block
        return {"batches": self.batches,
                "block": {"number": block.number, "start": block.start,
                          "segments": [[first, weights] for first, weights in block.segments]}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["block"] if "block" in state else None
        loaders = (saved["start"] if saved is not None else state)["loaders"]
        if len(loaders) != len(self.loaders):
            raise ValueError(f"the saved mixture state has {len(loaders)} sources, this loader {len(self.loaders)}")
        self.batches = int(state["batches"])
        self._block = None
        if saved is None:
            self._restore(state)
            self._replay = None
        else:
            self._replay = saved


class _Block:
    """``BLOCK`` batches' draws: their uniforms, rows and sources, and what refills them."""

    def __init__(self, number: int, block_uniforms: np.ndarray, start: dict[str, Any]) -> None:
        self.number, self.uniforms, self.start = number, block_uniforms, start
        self.rows: torch.Tensor | None = None  # [BLOCK, batch_size, seq_len + 1]
        self.sources: torch.Tensor | None = None  # [BLOCK, batch_size]
        self.inputs: torch.Tensor | None = None
        self.targets: torch.Tensor | None = None
        self.segments: list[tuple[int, list[float]]] = []  # (first batch, weights) in order


__all__ = ["MixtureLoader", "BLOCK", "uniforms", "draw_sources", "stack_collate"]
