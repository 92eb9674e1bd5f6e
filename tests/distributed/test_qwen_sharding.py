"""The Qwen families (framework/families/qwen2, qwen3: qkv bias; per-head q/k RMSNorm and
an explicit head_dim) sharded over 2 gloo ranks on CPU, block by block as Llama's
(framework/strategies/parallelize.py): under FSDP2 (a 1-D mesh) and HSDP (a
(replicate, shard) mesh) one training step gives the loss and every gradient of the
same step in one process on the whole batch, and the sharded checkpoint (DCP, as the
FSDP2 strategies write it) reads back in one process to the trained weights.

The ranks run in forked processes calling the model directly (seconds, where a
launched `layerdrop pretrain` costs a minute of start-up per rank). DeepSpeed ZeRO on
the Qwen families, through `layerdrop pretrain`: test_qwen_zero.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from framework.checkpoint.base import MODEL_PREFIX
from framework.config import ModelConfig
from framework.families.registry import build_decoder
from pretrain_launch import free_port

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

# Grouped-query attention (4 query heads on 2 K/V heads), Qwen3 with head_dim 12 != 32 / 4.
CONFIGS = {"qwen2": dict(family="qwen2", bias=False),  # its qkv bias is the family's own
           "qwen3": dict(family="qwen3", bias=False, head_dim=12)}
ROWS, SEQ = 4, 16  # the whole batch; each rank takes half of the rows


def qwen_decoder(kind: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    decoder = build_decoder(ModelConfig(vocab_size=96, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2,
                                        ffn_hidden=40, max_seq_len=SEQ, attention="sdpa", **CONFIGS[kind]))
    with torch.no_grad():  # biases and norm weights away from their 0 / 1 start, so their gradients mean something
        for name, param in decoder.named_parameters():
            if name.endswith(("bias", "norm.weight")):
                param.add_(torch.randn_like(param) * 0.3)
    return decoder


def batch() -> torch.Tensor:
    return torch.randint(0, 96, (ROWS, SEQ), generator=torch.Generator().manual_seed(7))


def loss_of(decoder: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = decoder(tokens)[:, :-1]
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def _rank(rank: int, port: int, kind: str, strategy: str, out: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from framework.strategies import parallelize
    from framework.strategies.parallelize import HSDP_MESH_DIMS

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        mesh = (init_device_mesh("cpu", (2,), mesh_dim_names=("data_parallel",)) if strategy == "fsdp" else
                init_device_mesh("cpu", (2, 1), mesh_dim_names=HSDP_MESH_DIMS))  # replicated across 2 "nodes"
        decoder = parallelize(qwen_decoder(kind), device_mesh=mesh)
        tokens = batch()[rank * ROWS // 2:(rank + 1) * ROWS // 2]
        loss = loss_of(decoder, tokens)
        loss.backward()  # FSDP2/HSDP average the gradients over the ranks: those of the mean loss
        total = loss.detach().clone()
        dist.all_reduce(total)
        grads = {name: p.grad.full_tensor() for name, p in decoder.named_parameters()}
        local_rows = {name: p.to_local().shape[0] for name, p in decoder.named_parameters()}
        weights = {name: p.full_tensor() for name, p in decoder.named_parameters()}
        state = {"state_dict": {MODEL_PREFIX + k: v for k, v in get_model_state_dict(decoder).items()}}
        dcp.save(state, checkpoint_id=Path(out) / "checkpoint")
        if rank == 0:
            torch.save({"loss": float(total) / 2, "grads": grads, "weights": weights, "local_rows": local_rows},
                       Path(out) / "rank0.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("strategy", ["fsdp", "hsdp"])
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_a_sharded_qwen_step_is_the_single_process_step_and_its_checkpoint_reads_back(tmp_path, kind, strategy):
    from framework.checkpoint.dcp_reader import load_into

    # fork: the ranks inherit this process's imports (a spawn re-imports torch in each).
    mp.start_processes(_rank, args=(free_port(), kind, strategy, str(tmp_path)), nprocs=2, join=True,
                       start_method="fork")
    got = torch.load(tmp_path / "rank0.pt", weights_only=True)
    reference = qwen_decoder(kind)
    loss = loss_of(reference, batch())
    loss.backward()
    assert got["loss"] == pytest.approx(float(loss.detach()), rel=1e-6)
    own = [n for n in got["grads"] if n.endswith(("qkv.bias", "q_norm.weight", "k_norm.weight"))]
    assert own, "the family's own parameters are not in the sharded model"
    for name, p in reference.named_parameters():
        torch.testing.assert_close(got["grads"][name], p.grad, rtol=1e-5, atol=1e-7, msg=name)
    if strategy == "fsdp":  # really sharded: rank 0 holds half of every matrix's rows (dim 0, rounded up)
        sizes = dict(reference.named_parameters())
        assert all(rows == -(-sizes[n].shape[0] // 2) for n, rows in got["local_rows"].items())
    # The checkpoint of the shards, read into a decoder of other weights in one process.
    fresh = qwen_decoder(kind, seed=1)
    load_into(fresh, tmp_path / "checkpoint")
    for name, p in fresh.named_parameters():
        assert torch.equal(p.detach(), got["weights"][name]), name
