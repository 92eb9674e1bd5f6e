"""Two "nodes" on one machine: recipes/launch/torchrun.sh started twice (NNODES=2,
NODE_RANK 0 and 1, one process each); the torchruns meet at a static rendezvous on
127.0.0.1 and run `layerdrop pretrain` under DDP: the path a cluster without SLURM takes.
"""

from __future__ import annotations

import math

import pytest

from pretrain_launch import LAYERS, finish, free_port, read_ranks, start, tiny_recipe, torchrun_node

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

STEPS = 8


def _node(node: int, port: int, recipe, tmp_path):
    command, env = torchrun_node(node, 2, port, recipe)
    return command, tmp_path / f"node{node}.log", env


def test_two_torchrun_nodes_train_together(tiny_data, tmp_path):
    recipe = tiny_recipe(tmp_path / "recipe.json", data_dir=tiny_data, root=tmp_path / "run", strategy="ddp",
                         steps=STEPS, devices=1, num_nodes=2, p_max=0.5, distribution="increasing",
                         schedule="decreasing", probe_dir=tmp_path / "probe")
    port = free_port()
    nodes = [start(*_node(node, port, recipe, tmp_path)) for node in (0, 1)]
    try:
        outputs = [finish(process, tmp_path / f"node{node}.log") for node, process in enumerate(nodes)]
    finally:
        for process in nodes:  # if one node failed, do not leave the other waiting
            if process.poll() is None:
                process.kill()
    assert "run summary" in outputs[0]
    ranks = read_ranks(tmp_path / "probe", 2)
    for rank in ranks:
        assert rank["world_size"] == 2 and rank["num_nodes"] == 2
        assert [s["step"] for s in rank["steps"]] == list(range(1, STEPS + 1))
        assert all(math.isfinite(s["loss"]) and len(s["rows_per_call"]) == LAYERS for s in rank["steps"])
    assert [s["rows_per_call"] for s in ranks[0]["steps"]] != [s["rows_per_call"] for s in ranks[1]["steps"]]
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
