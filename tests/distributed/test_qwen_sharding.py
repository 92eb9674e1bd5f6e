"""The Qwen families (framework/families/qwen2, qwen3: qkv bias; per-head q/k RMSNorm and
an explicit head_dim) over 2 gloo ranks on CPU, each rank on half of the batch: under
FSDP2 (a 1-D mesh, blocks wrapped one by one as Llama's: framework/strategies/
parallelize.py), HSDP (a (replicate, shard) mesh) and DeepSpeed ZeRO-2/3, one training
step gives what the same step gives in one process on the whole batch, and the
checkpoint the ranks write (DCP; a DeepSpeed folder as Lightning lays it out) reads
back in one process, by the project's readers, to the weights the ranks hold.

The ranks run in forked processes calling the model directly (seconds, where a
launched `layerdrop pretrain` costs a minute of start-up; the strategies' Lightning
side is the Celerity and Llama runs' in this folder).
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
LR = 0.1  # ZeRO's step: plain SGD, so the weights after it show the averaged gradient


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
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
    torch.set_num_threads(1)
    tokens = batch()[rank * ROWS // 2:(rank + 1) * ROWS // 2]
    if strategy.startswith("zero"):
        result = _zero_step(kind, int(strategy[-1]), tokens, Path(out))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=2)
        result = _fsdp_step(kind, strategy, tokens, Path(out))
    try:
        if rank == 0:
            torch.save(result, Path(out) / "rank0.pt")
    finally:
        dist.destroy_process_group()


def _fsdp_step(kind: str, strategy: str, tokens: torch.Tensor, out: Path) -> dict:
    """One step's loss and full gradients under FSDP2 or HSDP; the model written by DCP."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from framework.strategies import parallelize
    from framework.strategies.parallelize import HSDP_MESH_DIMS

    mesh = (init_device_mesh("cpu", (2,), mesh_dim_names=("data_parallel",)) if strategy == "fsdp" else
            init_device_mesh("cpu", (2, 1), mesh_dim_names=HSDP_MESH_DIMS))  # replicated across 2 "nodes"
    decoder = parallelize(qwen_decoder(kind), device_mesh=mesh)
    loss = loss_of(decoder, tokens)
    loss.backward()  # FSDP2/HSDP average the gradients over the ranks: those of the mean loss
    total = loss.detach().clone()
    dist.all_reduce(total)
    state = {"state_dict": {MODEL_PREFIX + k: v for k, v in get_model_state_dict(decoder).items()}}
    dcp.save(state, checkpoint_id=out / "checkpoint")
    return {"loss": float(total) / 2, "grads": {n: p.grad.full_tensor() for n, p in decoder.named_parameters()},
            "weights": {n: p.full_tensor() for n, p in decoder.named_parameters()},
            "local": {n: p.to_local().numel() for n, p in decoder.named_parameters()}}


def _zero_step(kind: str, stage: int, tokens: torch.Tensor, out: Path) -> dict:
    """One SGD step's loss and weights under DeepSpeed ZeRO-2/3 on CPU (gloo); the
    checkpoint written as Lightning's DeepSpeedStrategy writes it (tag "checkpoint",
    the layerdrop entries in the client state)."""
    from unittest import mock

    import deepspeed

    from framework.checkpoint.base import CKPT_KEY

    # As cpu_deepspeed.CPUDeepSpeedStrategy: no JIT-compiled shared-memory all-reduce.
    with mock.patch("deepspeed.comm.torch.build_shm_op", return_value=None):
        deepspeed.init_distributed(dist_backend="gloo")
    decoder = qwen_decoder(kind)
    config = decoder.config.to_dict()
    engine, *_ = deepspeed.initialize(model=decoder, optimizer=torch.optim.SGD(decoder.parameters(), lr=LR), config={
        "train_micro_batch_size_per_gpu": ROWS // 2, "zero_optimization": {"stage": stage},
        "gradient_clipping": 0.0,  # DeepSpeed clips at norm 1 unless told; the one-process step does not clip
        "zero_allow_untested_optimizer": True})
    local = {n: int(getattr(p, "ds_tensor", p).numel()) for n, p in engine.module.named_parameters()}
    loss = loss_of(engine, tokens)
    engine.backward(loss)
    engine.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):  # ZeRO-3: the whole tensors
        weights = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    engine.save_checkpoint(str(out / "checkpoint"), tag="checkpoint", client_state={CKPT_KEY: {"model_config": config}})
    return {"loss": float(total) / 2, "weights": weights, "local": local}


@pytest.mark.parametrize("strategy", ["fsdp", "hsdp", "zero2", "zero3"])
@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_a_sharded_qwen_step_is_the_single_process_step_and_its_checkpoint_reads_back(tmp_path, kind, strategy):
    """FSDP2/HSDP: the loss and every gradient; ZeRO: the loss and the weights after one
    SGD step (its gradients live in flat partitions). The checkpoint is read by the
    project's own readers: DCP into a decoder of other weights, the ZeRO folder by
    ``load_decoder`` (its config from the folder)."""
    from framework.checkpoint import load_decoder
    from framework.checkpoint.sharded.dcp_reader import load_into

    # fork: the ranks inherit this process's imports (a spawn re-imports torch in each).
    mp.start_processes(_rank, args=(free_port(), kind, strategy, str(tmp_path)), nprocs=2, join=True,
                       start_method="fork")
    got = torch.load(tmp_path / "rank0.pt", weights_only=True)
    reference = qwen_decoder(kind)
    loss = loss_of(reference, batch())
    loss.backward()
    assert got["loss"] == pytest.approx(float(loss.detach()), rel=1e-6)
    assert any(n.endswith(("qkv.bias", "q_norm.weight", "k_norm.weight")) for n in got["weights"]), \
        "the family's own parameters are not in the sharded model"
    params = dict(reference.named_parameters())
    if strategy in ("fsdp", "zero3"):  # parameters really sharded: rank 0 holds half of each (rounded up)
        halves = {n: -(-p.numel() // 2) if strategy == "zero3" else -(-p.shape[0] // 2) * p[0].numel()
                  for n, p in params.items()}
        assert got["local"] == halves
    if strategy.startswith("zero"):
        with torch.no_grad():
            for name, p in params.items():
                torch.testing.assert_close(got["weights"][name], p - LR * p.grad, rtol=1e-5, atol=1e-7, msg=name)
        loaded, config = load_decoder(tmp_path / "checkpoint")
        assert config.family == kind
    else:
        for name, p in params.items():
            torch.testing.assert_close(got["grads"][name], p.grad, rtol=1e-5, atol=1e-7, msg=name)
        loaded = qwen_decoder(kind, seed=1)  # other weights until read
        load_into(loaded, tmp_path / "checkpoint")
    for name, p in loaded.named_parameters():
        assert torch.equal(p.detach(), got["weights"][name]), name
