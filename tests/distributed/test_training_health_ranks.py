"""Training health over 2 gloo ranks: a squared sum over this rank's part of a tensor,
divided by its replica count and added over ranks, counts every element once, whether
the tensor is an FSDP2 shard (DTensor Shard), replicated (DTensor Replicate) or a plain
DDP copy."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from framework.training.health import _local, _replicas, _squared_sum
from pretrain_launch import free_port

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]


def _rank(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        full = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
        trainer = SimpleNamespace(world_size=2)
        forms = {"shard": distribute_tensor(full, mesh, [Shard(0)]),
                 "replicate": distribute_tensor(full, mesh, [Replicate()]), "plain": full.clone()}
        totals = {}
        for name, tensor in forms.items():
            local = _squared_sum([_local(tensor)], [_replicas(tensor, trainer)], torch.device("cpu"))
            dist.all_reduce(local)
            totals[name] = float(local)
        if rank == 0:
            Path(out).write_text(json.dumps({"totals": totals, "expected": float(full.double().square().sum()),
                                             "local_rows": _local(forms["shard"]).shape[0]}))
    finally:
        dist.destroy_process_group()


def test_squared_sums_count_every_element_once_over_shards_replicas_and_copies(tmp_path):
    out = tmp_path / "result.json"
    # fork: the ranks inherit this process's imports (spawn spent most of the test
    # importing torch and Lightning again in each rank).
    mp.start_processes(_rank, args=(free_port(), str(out)), nprocs=2, join=True, start_method="fork")
    result = json.loads(out.read_text())
    assert result["local_rows"] == 3  # really sharded: each rank holds half the rows
    for name, total in result["totals"].items():
        assert total == pytest.approx(result["expected"], rel=1e-6), name
