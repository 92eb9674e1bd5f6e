"""Parallelism applied from outside the model, and the named Lightning strategies.

``parallelize`` follows torchtitan's order, each step per transformer block:

    activation checkpointing -> torch.compile -> FSDP2 ``fully_shard`` (blocks, then root)

Checkpointing comes first so FSDP's hooks run around the recomputation too (the
recomputed forward all-gathers the block's parameters again); FSDP comes last so it
shards the module that will actually be called. Every step keeps the parameters'
names ("blocks.3.attn.qkv.weight"): the optimizer's parameter groups
(framework/parametrization.py) and checkpoints match on them.

Layer dropout needs nothing special here, because ``Decoder`` calls every block on
every forward (on zero rows if the block is dropped for the whole micro-batch): FSDP2
all-gathers inside a block's pre-forward hook, so every rank reaches every collective.

``build_strategy`` maps the names a recipe uses to Lightning strategy objects and
rejects combinations that cannot run, before any process is started.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

if TYPE_CHECKING:
    from lightning.pytorch.strategies import Strategy
    from torch.distributed.device_mesh import DeviceMesh

STRATEGIES = ("single", "ddp", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3")
ACCELERATORS = ("cpu", "gpu", "cuda", "auto")
_DEEPSPEED_STAGES = {"deepspeed_stage_2": 2, "deepspeed_stage_3": 3}


# --------------------------------------------------------------------- parallelize


def parallelize(decoder: nn.Module, *, device_mesh: "DeviceMesh | None" = None,
                activation_checkpointing: bool = False, compile: bool = False) -> nn.Module:
    """Apply activation checkpointing, compilation and FSDP2 to ``decoder`` in place.

    ``device_mesh`` is Lightning's ModelParallelStrategy mesh (its "data_parallel" dim
    is used) or any 1-D mesh; without one the model stays unsharded (single device,
    DDP, DeepSpeed). Returns ``decoder`` for chaining.
    """
    blocks = _blocks_of(decoder)
    if activation_checkpointing:
        for block in blocks:
            checkpoint_block(block)
    if compile:
        for block in blocks:
            compile_block(block)
    if device_mesh is not None:
        shard(decoder, _data_parallel_mesh(device_mesh))
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

    The kept-row index tensors change length every step (0..B); marking their size
    unbacked asks for one graph for every length, where a plain dynamic shape
    recompiles for 0 and 1 (ENVIRONMENT.md). Checked on CPU: the same gradients as
    eager over steps with zero-row layers, with activation checkpointing on top.
    """
    compiled = torch.compile(block.forward)

    def forward(h: torch.Tensor, bias: torch.Tensor | None, drop: Any = None, cache: Any = None) -> torch.Tensor:
        if drop is not None:
            for rows in {id(r): r for r in (drop.attn_rows, drop.ffn_rows) if r is not None}.values():
                torch._dynamo.decorators.mark_unbacked(rows, 0)
        return compiled(h, bias, drop, cache)

    block.forward = forward
    return block


def shard(decoder: nn.Module, mesh: "DeviceMesh") -> nn.Module:
    """FSDP2: one all-gather unit per block, then the root (embedding, norm, head).

    The root keeps its parameters gathered after forward (reshard_after_forward=False)
    because backward needs the head immediately.
    """
    from torch.distributed.fsdp import fully_shard

    for block in _blocks_of(decoder):
        fully_shard(block, mesh=mesh)
    fully_shard(decoder, mesh=mesh, reshard_after_forward=False)
    return decoder


def full_parameters(module: nn.Module) -> AbstractContextManager:
    """A context in which ``module``'s parameters hold their full values, and what rank
    0 writes to them persists: for initialising weights after construction.

    Under DeepSpeed ZeRO-3 the parameters are partitioned as they are created
    (Lightning builds the model inside ``deepspeed.zero.Init``), so each rank holds an
    empty placeholder; writing to it would silently do nothing. Elsewhere (single
    device, DDP, ZeRO-2, FSDP2 before ``fully_shard``) this is a no-op.
    """
    partitioned = [p for p in module.parameters() if hasattr(p, "ds_id")]
    if not partitioned:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(partitioned, modifier_rank=0)


def _blocks_of(decoder: nn.Module) -> list[nn.Module]:
    blocks = getattr(decoder, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise ValueError(f"parallelize needs a Decoder with a `blocks` ModuleList; got {type(decoder).__name__}")
    return list(blocks)


def _data_parallel_mesh(mesh: "DeviceMesh") -> "DeviceMesh":
    names = mesh.mesh_dim_names or ()
    if "data_parallel" in names:
        return mesh["data_parallel"]
    if mesh.ndim == 1:
        return mesh
    raise ValueError(f"device_mesh has dims {names}; expected a 'data_parallel' dim or a 1-D mesh")


# ------------------------------------------------------------------ strategies


def resolve_accelerator(accelerator: str) -> str:
    """"cpu" or "gpu" ("auto" picks the GPU when CUDA is available)."""
    if accelerator not in ACCELERATORS:
        raise ValueError(f"accelerator={accelerator!r} is invalid: allowed are {', '.join(ACCELERATORS)}")
    if accelerator == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    return "gpu" if accelerator == "cuda" else accelerator


def precision_for(accelerator: str) -> str:
    """bf16 autocast with fp32 master weights on GPUs; plain fp32 on CPUs."""
    return "bf16-mixed" if resolve_accelerator(accelerator) == "gpu" else "32-true"


def build_strategy(name: str, *, accelerator: str, devices: Any = 1, num_nodes: int = 1,
                   timeout: timedelta | None = None) -> "Strategy":
    """The Lightning strategy for a recipe's ``name`` on ``num_nodes`` × ``devices``.

    single             SingleDeviceStrategy (one CPU or one GPU)
    ddp                DDPStrategy (replicas; gradients all-reduced)
    fsdp               ModelParallelStrategy, data-parallel only: FSDP2 ``fully_shard``
                       per block, applied by ``parallelize`` from configure_model
    deepspeed_stage_2  DeepSpeedStrategy(stage=2): optimizer state and gradients sharded
    deepspeed_stage_3  DeepSpeedStrategy(stage=3): parameters sharded too
    """
    accelerator = resolve_accelerator(accelerator)
    world_size = _world_size(accelerator, devices, num_nodes)
    _check_combination(name, accelerator, world_size)
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    if name == "single":
        from lightning.pytorch.strategies import SingleDeviceStrategy

        return SingleDeviceStrategy(device=torch.device("cuda", 0) if accelerator == "gpu" else torch.device("cpu"))
    if name == "ddp":
        from lightning.pytorch.strategies import DDPStrategy

        return DDPStrategy(**kwargs)
    if name == "fsdp":
        from lightning.pytorch.strategies import ModelParallelStrategy

        return ModelParallelStrategy(data_parallel_size=world_size, tensor_parallel_size=1, **kwargs)
    from lightning.pytorch.strategies import DeepSpeedStrategy

    return DeepSpeedStrategy(stage=_DEEPSPEED_STAGES[name], **kwargs)


def _world_size(accelerator: str, devices: Any, num_nodes: int) -> int:
    count = _device_count(accelerator, devices)
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes={num_nodes!r} is invalid: must be an integer >= 1")
    return count * num_nodes


def _device_count(accelerator: str, devices: Any) -> int:
    """Devices per node, read as Lightning reads ``Trainer(devices=...)``: a count (also
    as a string, which is how a command line passes it), a list of indices ("0,1" or
    [0, 1]), or "auto"/-1 for every GPU (one process on a CPU)."""
    if devices in ("auto", -1, "-1"):
        return max(torch.cuda.device_count(), 1) if accelerator == "gpu" else 1
    if isinstance(devices, str) and devices.strip().isdigit():
        devices = int(devices)
    elif isinstance(devices, str) and "," in devices:
        devices = [part for part in devices.split(",") if part.strip()]
    if isinstance(devices, (list, tuple)) and devices:
        return len(devices)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices={devices!r} is invalid: must be a count >= 1, a list of device "
                         "indices, or 'auto'")
    return devices


def _check_combination(name: str, accelerator: str, world_size: int) -> None:
    if name not in STRATEGIES:
        raise ValueError(f"strategy={name!r} is invalid: allowed are {', '.join(STRATEGIES)}")
    if name == "single" and world_size != 1:
        raise ValueError(f"strategy='single' runs on one device, got {world_size} (devices × num_nodes); "
                         "use ddp, fsdp or deepspeed_stage_2/3 for more")
    if name == "fsdp" and world_size < 2:
        raise ValueError("strategy='fsdp' shards over devices × num_nodes >= 2, got 1; use 'single' on one device")
    if name in _DEEPSPEED_STAGES and accelerator != "gpu":
        raise ValueError(f"strategy={name!r} needs accelerator='gpu' (Lightning's DeepSpeed is CUDA-only), "
                         f"got {accelerator!r}; on CPU use ddp or fsdp")
