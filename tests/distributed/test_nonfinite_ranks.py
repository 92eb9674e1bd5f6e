"""A non-finite gradient on one rank only: every rank skips that optimizer step, so the
replicas stay identical. The run is the 4-rank DDP reference over two torchrun "nodes"
(conftest.py's nodes_ddp_run: rank 1 poisons one gradient element at step 2); HSDP's
run does the same (test_hsdp.py), FSDP2's is the crash chain in test_crash_resume.py,
the policy itself is tests/training/test_nonfinite.py."""

from __future__ import annotations

import pytest

from crash_points import read_records, skipped_line
from pretrain_launch import NODES_STEPS, POISONED_STEP

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]


def test_ddp_ranks_agree_to_skip_a_step_only_one_of_them_saw_go_non_finite(nodes_ddp_run):
    assert skipped_line(POISONED_STEP) in (nodes_ddp_run / "node0.log").read_text()
    ranks = [{r["step"]: r["weights"] for r in read_records(nodes_ddp_run / "records", rank)} for rank in range(4)]
    assert all(rank == ranks[0] for rank in ranks[1:])  # the replicas never diverged
    weights = ranks[0]
    assert sorted(weights) == list(range(NODES_STEPS))
    assert weights[POISONED_STEP] == weights[POISONED_STEP - 1]  # no update at the skipped step...
    others = [weights[step] for step in weights if step != POISONED_STEP]
    assert len(set(others)) == len(others)  # ...and at every other one
