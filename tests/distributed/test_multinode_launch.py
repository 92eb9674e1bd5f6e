"""Two "nodes" on one machine: recipes/launch/torchrun.sh started twice (NNODES=2,
NODE_RANK 0 and 1, two processes each); the torchruns meet at a static rendezvous on
127.0.0.1 and run `layerdrop pretrain` under DDP over 4 ranks: the path a cluster
without SLURM takes. This run is also the reference the HSDP run (test_hsdp.py) must
reproduce at the same global batch.
"""

from __future__ import annotations

import math

import pytest
import torch

from pretrain_launch import LAYERS, read_ranks

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]


def test_two_torchrun_nodes_of_two_devices_train_together(nodes_ddp_run):
    assert "run summary" in (nodes_ddp_run / "node0.log").read_text()
    ranks = read_ranks(nodes_ddp_run / "probe", 4)
    steps = len(ranks[0]["steps"])
    for rank in ranks:
        assert rank["world_size"] == 4 and rank["num_nodes"] == 2 and rank["strategy"] == "DDPStrategy"
        assert [s["step"] for s in rank["steps"]] == list(range(1, steps + 1))
        assert all(math.isfinite(s["loss"]) and len(s["rows_per_call"]) == LAYERS for s in rank["steps"])
    masks = [[s["rows_per_call"] for s in rank["steps"]] for rank in ranks]
    assert all(masks[0] != other for other in masks[1:])  # every device draws its own
    first, *others = (torch.load(nodes_ddp_run / "probe" / f"parameters-rank{r}.pt", weights_only=True)
                      for r in range(4))
    for other in others:  # the replicas agree across the two "nodes"
        assert all(torch.equal(first[name], other[name]) for name in first)
    assert (nodes_ddp_run / "run" / "checkpoints" / "last.ckpt").is_file()
