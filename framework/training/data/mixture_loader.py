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


def draw_sources(weights: list[float], batch_size: int, seed: int, rank: int, batch: int) -> np.ndarray:
    """The source of each row of one batch: a pure function of (seed, rank, batch number), so
    a resumed run draws what the uninterrupted one would have and every rank draws its own."""
    generator = np.random.default_rng([seed, rank, batch])
    return generator.choice(len(weights), size=batch_size, p=np.asarray(weights) / np.sum(weights))


class MixtureLoader:
    """``(inputs, targets, sources)`` batches from several single-source loaders.

    ``loaders`` serve blocks of seq_len + 1 tokens (``stack_collate``) in batches of any size;
    ``weights`` are the sources' shares, or a function giving them for the next batch (a
    schedule of weights over the run's steps); ``sources`` is the int64 source index of each row.
    """

    def __init__(self, loaders: list[StreamingDataLoader], weights: list[float] | Callable[[], list[float]],
                 batch_size: int, seed: int, rank: int = 0) -> None:
        self.loaders = loaders
        self.weights_now = weights if callable(weights) else (lambda fixed=list(weights): fixed)
        self.batch_size, self.seed, self.rank = batch_size, seed, rank
        self.batches = 0  # batches served: the next draw's number
        self._iterators: list[Iterator | None] = [None] * len(loaders)
        self._waiting: list[list[torch.Tensor]] = [[] for _ in loaders]  # rows served by a loader, not yet used

    def __len__(self) -> int:
        # Never reached (the mixture cycles), but a length stops Lightning from fetching a
        # batch ahead, which would put a checkpoint's loader state one batch past training.
        return sys.maxsize

    def __iter__(self) -> MixtureLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sources = draw_sources(self.weights_now(), self.batch_size, self.seed, self.rank, self.batches)
        rows = [self._take(int(source)) for source in sources]
        self.batches += 1
        blocks = torch.stack(rows)
        return blocks[:, :-1], blocks[:, 1:], torch.from_numpy(sources.astype(np.int64))

    def _take(self, source: int) -> torch.Tensor:
        """The next row of one source, from its loader (a new epoch of it when it runs out)."""
        waiting = self._waiting[source]
        if not waiting:
            waiting.extend(self._next_batch(source))
        return waiting.pop(0)

    def _next_batch(self, source: int) -> torch.Tensor:
        for attempt in range(2):
            if self._iterators[source] is None:
                self._iterators[source] = iter(self.loaders[source])
            try:
                return next(self._iterators[source])
            except StopIteration:
                self._iterators[source] = None  # the next iter() starts the source's next epoch
        raise RuntimeError(f"source {source} of the mixture served no batch in a whole epoch")

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches, "loaders": [loader.state_dict() for loader in self.loaders],
                "waiting": [torch.stack(rows).tolist() if rows else [] for rows in self._waiting]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["loaders"]) != len(self.loaders):
            raise ValueError(f"the saved mixture state has {len(state['loaders'])} sources, this loader "
                             f"{len(self.loaders)}")
        self.batches = int(state["batches"])
        for loader, loader_state in zip(self.loaders, state["loaders"]):
            loader.load_state_dict(loader_state)
        self._iterators = [None] * len(self.loaders)
        self._waiting = [[torch.tensor(row, dtype=torch.int64) for row in rows] for rows in state["waiting"]]


__all__ = ["MixtureLoader", "draw_sources", "stack_collate"]
