"""MixtureLoader's blocks: a resume anywhere in or across a block, and weights that change
inside one, serve what the uninterrupted run serves; rows a redrawn batch gave back come
later, none twice."""

import itertools

import pytest
import torch

from framework.training.data import TokenDataModule
from framework.training.data.mixture_loader import BLOCK, draw_sources

SEQ, BATCH = 32, 4


def _loader(sources, change_at=None):
    """The email/http mixture at 3:1, turned to 1:3 from batch ``change_at`` (a schedule, as the
    data module's weights function gives one, but by batch so no Trainer is needed)."""
    module = TokenDataModule(mixture={"email": {"dir": sources["email"], "weight": 3},
                                      "http": {"dir": sources["http"], "weight": 1}},
                             seq_len=SEQ, batch_size=BATCH, seed=5, shuffle=False)
    module.setup("fit")
    loader = module.train_dataloader()
    if change_at is not None:
        loader.weights_now = lambda: [3.0, 1.0] if loader.batches < change_at else [1.0, 3.0]
    return loader


def _rows(loader, limit):
    rows = []
    for inputs, targets, source in itertools.islice(loader, limit):
        full = torch.cat([inputs, targets[:, -1:]], dim=1)
        rows += [(int(s), tuple(row.tolist())) for s, row in zip(source, full)]
    return rows


@pytest.mark.parametrize("stop", [5, BLOCK, BLOCK + 3])
@pytest.mark.parametrize("change_at", [None, 10, BLOCK + 1])
def test_a_resume_in_or_across_a_block_serves_the_uninterrupted_batches(mixture_sources, stop, change_at):
    total = BLOCK + 8
    uninterrupted = _rows(_loader(mixture_sources, change_at), total)
    first = _loader(mixture_sources, change_at)
    assert _rows(first, stop) == uninterrupted[:stop * BATCH]
    resumed = _loader(mixture_sources, change_at)
    resumed.load_state_dict(first.state_dict())
    assert resumed.state_dict() == first.state_dict()  # a state saved before the refill is the same state
    assert _rows(resumed, total - stop) == uninterrupted[stop * BATCH:]


def test_weights_changed_inside_a_block_give_its_rows_back_in_order(mixture_sources):
    """Unshuffled sources: each source's rows are served in the folder's order, with or without a
    change of weights at batch 10 (so the rows the block had drawn for batches 10... went back)."""
    def per_source(rows):
        return [[block for source, block in rows if source == index] for index in (0, 1)]

    plain = per_source(_rows(_loader(mixture_sources, change_at=10**9), BLOCK))
    changed = per_source(_rows(_loader(mixture_sources, change_at=10), BLOCK))
    for before, after in zip(plain, changed):
        shorter = min(len(before), len(after))
        assert before[:shorter] == after[:shorter]
    assert len(changed[1]) > len(plain[1])  # http weighted up from batch 10


def test_the_sources_drawn_follow_the_weights_on_the_same_uniforms():
    uniforms = torch.linspace(0, 0.999, 8).numpy()
    assert draw_sources([3, 1], uniforms).tolist() == [0, 0, 0, 0, 0, 0, 1, 1]
    assert draw_sources([1, 3], uniforms).tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    assert draw_sources([1, 0], uniforms).tolist() == [0] * 8
