"""A non-finite gradient on one DDP rank only: every rank skips that optimizer step, so
the replicas stay identical (2 processes over gloo). FSDP2 is covered by the crash
chain in test_crash_resume.py, the policy itself by tests/test_nonfinite.py."""

from __future__ import annotations

import json

import pytest

from crash_points import read_records
from pretrain_launch import pretrain_command, run, tiny_recipe

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]


def test_ddp_ranks_agree_to_skip_a_step_only_one_of_them_saw_go_non_finite(tmp_path, tiny_data):
    recipe = tiny_recipe(tmp_path / "recipe.json", data_dir=tiny_data, root=tmp_path / "run", strategy="ddp",
                         steps=5, p_max=0.6, distribution="increasing", schedule="constant")
    config = json.loads(recipe.read_text())
    config["trainer"]["logger"] = False
    config["trainer"]["callbacks"] = [
        {"class_path": "crash_points.PoisonGradient", "init_args": {"step": 2, "rank": 1}},
        {"class_path": "crash_points.RecordLosses", "init_args": {"out_dir": str(tmp_path / "records")}}]
    recipe.write_text(json.dumps(config))
    log = run(pretrain_command(recipe), tmp_path / "log.txt")

    assert "step 2 (batch 2): non-finite gradient norm on rank 1; skipped" in log
    ranks = [{r["step"]: r["weights"] for r in read_records(tmp_path / "records", rank)} for rank in range(2)]
    assert ranks[0] == ranks[1]  # the replicas never diverged
    weights = ranks[0]
    assert sorted(weights) == [0, 1, 2, 3, 4]
    assert weights[2] == weights[1]  # no update at the skipped step...
    assert len({weights[0], weights[1], weights[3], weights[4]}) == 4  # ...and at every other one
