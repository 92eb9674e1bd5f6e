"""Parallelism applied from outside the model, following torchtitan's order, each step
per transformer block:

    activation checkpointing -> torch.compile -> FSDP2 ``fully_shard`` (blocks, then root)

Checkpointing comes first so FSDP's hooks run around the recomputation too (the
recomputed forward all-gathers the block's parameters again); FSDP comes last so it
shards the module that will actually be called. Every step keeps the parameters'
names ("blocks.3.attn.qkv.weight"): the optimizer's parameter groups
(framework/training/parametrization.py) and checkpoints match on them.

Layer dropout needs nothing special here, because ``Decoder`` calls every block on
every forward (on zero rows if the block is dropped for the whole micro-batch): FSDP2
all-gathers inside a block's pre-forward hook, so every rank reaches every collective.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

# HSDP's 2-D mesh: replicas over the first dim, shards over the second.
HSDP_MESH_DIMS = ("replicate", "shard")


def parallelize(decoder: nn.Module, *, device_mesh: "DeviceMesh | None" = None,
                mp_policy: "MixedPrecisionPolicy | None" = None,
                activation_checkpointing: bool = False, compile: bool = False) -> nn.Module:
    """Apply activation checkpointing, compilation and FSDP2 to ``decoder`` in place.

    ``device_mesh``: a 1-D mesh (FSDP over its ranks), a ("replicate", "shard") mesh
    (HSDP), or a mesh with a "data_parallel" dim (Lightning's ModelParallelStrategy);
    without one the model stays unsharded (single device, DDP, DeepSpeed) and
    ``mp_policy`` must be None. Returns ``decoder`` for chaining.
    """
    blocks = _blocks_of(decoder)
    if mp_policy is not None and device_mesh is None:
        raise ValueError("mp_policy is FSDP2's: it needs a device_mesh to shard over")
    if activation_checkpointing:
        for block in blocks:
            checkpoint_block(block)
    if compile:
        for block in blocks:
            compile_block(block)
    if device_mesh is not None:
        shard(decoder, fsdp_mesh(device_mesh), mp_policy)
    return decoder


def checkpoint_block(block: nn.Module) -> nn.Module:
    """Recompute the block's activations in backward instead of keeping them.

    The composable (hook-based) checkpoint leaves the module tree and the parameter
    names as they are, unlike a wrapper module, and passes (h, bias, drop, cache)
    through unchanged. It is always non-reentrant.
    """
    from torch.distributed._composable import checkpoint

    # preserve_rng_state=False: the blocks draw no random numbers (the masks come
    # from the drop plan, drawn before the forward), so there is no RNG to replay.
    return checkpoint(block, preserve_rng_state=False)


def compile_block(block: nn.Module) -> nn.Module:
    """Compile the block's forward (not its hooks: checkpoint and FSDP stay eager).

    What changes from step to step must reach the graph as tensor data, not as a
    constant baked into it, or every step recompiles (and after torch._dynamo's
    recompile_limit the block silently runs eager): the kept-row index tensors change
    length (0..B), so their size is marked unbacked (one graph for every length, where
    a plain dynamic shape recompiles for 0 and 1, ENVIRONMENT.md); r_train = 1/ρ
    changes with the schedule, so it goes in as a 0-d tensor. tests/strategies/test_parallelize.py
    counts the graphs and checks the gradients against eager.
    """
    compiled = torch.compile(block.forward)

    def forward(h: torch.Tensor, bias: torch.Tensor | None, drop: Any = None, cache: Any = None) -> torch.Tensor:
        if drop is not None:
            for rows in {id(r): r for r in (drop.attn_rows, drop.ffn_rows) if r is not None}.values():
                torch._dynamo.decorators.mark_unbacked(rows, 0)
            if drop.attn_rows is not None and drop.ffn_rows is not None:  # (a dense branch takes a number)
                drop = dataclasses.replace(drop, scale=torch.tensor(drop.scale, device=h.device))
        return compiled(h, bias, drop, cache)

    block.forward = forward
    return block


def shard(decoder: nn.Module, mesh: "DeviceMesh", mp_policy: "MixedPrecisionPolicy | None" = None) -> nn.Module:
    """FSDP2: one all-gather unit per block, then the root (embedding, norm, head).

    The root keeps its parameters gathered after forward (reshard_after_forward=False):
    the loss calls ``decoder.logits`` once per chunk of tokens (framework/model/loss.py), and
    those calls reuse the root's gathered weights instead of all-gathering the
    embedding and unembedding again. A 2-D mesh shards over its second dim and
    replicates over its first (HSDP).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = mp_policy or MixedPrecisionPolicy()
    for block in _blocks_of(decoder):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(decoder, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    register_extra_forward_methods(decoder)
    return decoder


def register_extra_forward_methods(decoder: nn.Module) -> None:
    """FSDP2 unshards the root's parameters in a pre-forward hook of ``forward``; the
    training step calls ``hidden`` instead, so it gets the hook too. Not ``logits``: it
    runs right after ``hidden`` on the root's still-gathered weights (the root is not
    resharded after forward), and as an FSDP forward of its own each loss chunk would
    all-gather the embedding and head again in backward."""
    try:
        from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method
    except ImportError:
        return
    if isinstance(decoder, FSDPModule):
        register_fsdp_forward_method(decoder, "hidden")


def fsdp_mesh(mesh: "DeviceMesh") -> "DeviceMesh":
    """The mesh ``fully_shard`` gets: HSDP's 2-D (replicate, shard) mesh as it is, the
    "data_parallel" dim of Lightning's mesh, or a 1-D mesh."""
    names = mesh.mesh_dim_names or ()
    if names == HSDP_MESH_DIMS:
        return mesh
    if "data_parallel" in names and mesh.ndim > 1:
        return mesh["data_parallel"]
    if mesh.ndim == 1:
        return mesh
    raise ValueError(f"device_mesh has dims {names}; expected {HSDP_MESH_DIMS}, a 'data_parallel' "
                     "dim or a 1-D mesh")


def _blocks_of(decoder: nn.Module) -> list[nn.Module]:
    blocks = getattr(decoder, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise ValueError(f"parallelize needs a Decoder with a `blocks` ModuleList; got {type(decoder).__name__}")
    return list(blocks)


__all__ = ["parallelize", "checkpoint_block", "compile_block", "shard", "fsdp_mesh", "HSDP_MESH_DIMS"]
