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

FSDP2 mixed precision (``MixedPrecisionPolicy``, the same on every block and the root):
the sharded parameters, their gradients and AdamW's state stay float32 (the master
weights); before a block runs, its shards are all-gathered in ``param_dtype`` (bf16 on
GPUs: half the bytes of float32), and its gradients are reduce-scattered in
``reduce_dtype`` (float32 by default, so the sum over ranks loses nothing). The cast
happens once per all-gather, at the module boundary, where autocast would cast every
weight at every matmul.

Strategies are one registry, ``STRATEGIES``: recipe name -> builder. ``fsdp`` and
``hsdp`` build ``FSDP2Strategy`` / ``HSDPStrategy`` (ours: Lightning's
ModelParallelStrategy builds only a data x tensor mesh); every builder rejects a
combination that cannot run before any process is started.
"""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Literal, Union

import torch
import torch.nn as nn
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy

from framework.config import PositiveInt, check

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.precision import Precision
    from lightning.pytorch.strategies import Strategy
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

ACCELERATORS = ("cpu", "gpu", "cuda", "auto")
PARAM_DTYPES = ("auto", "bfloat16", "float32")  # "auto": bfloat16 on GPUs, float32 on CPUs
REDUCE_DTYPES = ("float32", "bfloat16")
# Lightning precisions that keep float32 weights in the optimizer (the "-true" low
# precisions would convert the sharded master weights themselves).
FSDP2_PRECISIONS = ("32-true", "bf16-mixed")


# --------------------------------------------------------------------- parallelize


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
    changes with the schedule, so it goes in as a 0-d tensor. tests/test_strategies.py
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
    the loss calls ``decoder.logits`` once per chunk of tokens (framework/loss.py), and
    those calls reuse the root's gathered weights instead of all-gathering the
    embedding and unembedding again. A 2-D mesh shards over its second dim and
    replicates over its first (HSDP).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = mp_policy or MixedPrecisionPolicy()
    for block in _blocks_of(decoder):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(decoder, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
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


def fsdp_mesh(mesh: "DeviceMesh") -> "DeviceMesh":
    """The mesh ``fully_shard`` gets: HSDP's 2-D (replicate, shard) mesh as it is, the
    "data_parallel" dim of Lightning's mesh, or a 1-D mesh."""
    names = mesh.mesh_dim_names or ()
    if names == HSDPStrategy.MESH_DIMS:
        return mesh
    if "data_parallel" in names and mesh.ndim > 1:
        return mesh["data_parallel"]
    if mesh.ndim == 1:
        return mesh
    raise ValueError(f"device_mesh has dims {names}; expected {HSDPStrategy.MESH_DIMS}, a 'data_parallel' "
                     "dim or a 1-D mesh")


def _blocks_of(decoder: nn.Module) -> list[nn.Module]:
    blocks = getattr(decoder, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise ValueError(f"parallelize needs a Decoder with a `blocks` ModuleList; got {type(decoder).__name__}")
    return list(blocks)


# ----------------------------------------------------------- FSDP2 mixed precision


def mixed_precision_policy(param_dtype: str = "auto", reduce_dtype: str = "float32", *,
                           device_type: str = "cpu") -> "MixedPrecisionPolicy":
    """FSDP2's policy from names: ``param_dtype`` is the dtype of the all-gathered
    (compute) parameters, "auto" meaning bfloat16 on CUDA and float32 elsewhere (a CPU
    run stays float32 unless asked); ``reduce_dtype`` that of the gradient
    reduce-scatter (and HSDP's all-reduce)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    check_dtype_names(param_dtype, reduce_dtype)
    if param_dtype == "auto":
        param_dtype = "bfloat16" if device_type == "cuda" else "float32"
    if param_dtype == "float32" and reduce_dtype == "float32":
        return MixedPrecisionPolicy()  # no casts at all: exactly FSDP2 without a policy
    return MixedPrecisionPolicy(param_dtype=getattr(torch, param_dtype), reduce_dtype=getattr(torch, reduce_dtype))


def check_dtype_names(param_dtype: Any, reduce_dtype: Any) -> None:
    if param_dtype not in PARAM_DTYPES:
        raise ValueError(f"param_dtype={param_dtype!r} is invalid: allowed are {', '.join(PARAM_DTYPES)}")
    if reduce_dtype not in REDUCE_DTYPES:
        raise ValueError(f"reduce_dtype={reduce_dtype!r} is invalid: allowed are {', '.join(REDUCE_DTYPES)}")


def mixed_precision_of(module: "pl.LightningModule") -> "MixedPrecisionPolicy | None":
    """The FSDP2 policy of the strategy training ``module``: set by ``FSDP2Strategy``
    and ``HSDPStrategy``; None for any other strategy or without a Trainer."""
    try:
        strategy = module.trainer.strategy
    except RuntimeError:  # not attached to a Trainer (a module built by hand)
        return None
    return strategy.mp_policy if isinstance(strategy, FSDP2Strategy) else None


# ------------------------------------------------------------ FSDP2 / HSDP strategies


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 over every device of every node (a 1-D mesh), with a mixed-precision policy.

    The LightningModule applies ``fully_shard`` in ``configure_model`` through
    ``parallelize(..., device_mesh=self.device_mesh, mp_policy=mixed_precision_of(self))``.

    Args:
        param_dtype: dtype of the all-gathered parameters and of the forward/backward
            compute ("auto": bfloat16 on GPUs, float32 on CPUs; or "bfloat16", "float32").
        reduce_dtype: dtype of the gradient reduction ("float32" or "bfloat16").
        save_distributed_checkpoint: a folder of shards (True) or one file gathered on
            rank 0 (False), as in Lightning's ModelParallelStrategy.

    Composes with Lightning's precision ``bf16-mixed`` (autocast stays on: the blocks'
    weights arrive in bf16 already, so it casts no weight; it still runs layer norms
    and softmaxes in float32) or ``32-true`` (the policy alone decides the compute
    dtype). ``bf16-true``/``16-true`` are refused: they would make the sharded master
    weights and AdamW's state low precision.
    """

    def __init__(self, param_dtype: str = "auto", reduce_dtype: str = "float32",
                 save_distributed_checkpoint: bool = True, process_group_backend: str | None = None,
                 timeout: timedelta | None = default_pg_timeout) -> None:
        check_dtype_names(param_dtype, reduce_dtype)
        super().__init__(data_parallel_size="auto", tensor_parallel_size=1,
                         save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend, timeout=timeout)
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype

    @property
    def mp_policy(self) -> "MixedPrecisionPolicy":
        return mixed_precision_policy(self.param_dtype, self.reduce_dtype, device_type=self.root_device.type)

    @property
    def precision_plugin(self) -> "Precision":
        return ModelParallelStrategy.precision_plugin.fget(self)

    @precision_plugin.setter
    def precision_plugin(self, plugin: "Precision | None") -> None:
        # Lightning hands the precision over while building the Trainer: refusing here
        # stops before any process is launched.
        name = getattr(plugin, "precision", "32-true")
        if plugin is not None and name not in FSDP2_PRECISIONS:
            raise ValueError(f"precision={name!r} is invalid with strategy {type(self).__name__}: allowed are "
                             f"{', '.join(FSDP2_PRECISIONS)} (the optimizer keeps float32 master weights; "
                             "bf16 compute comes from param_dtype)")
        ModelParallelStrategy.precision_plugin.fset(self, plugin)

    def setup_environment(self) -> None:
        from framework.lightning_internals import install_device_mesh, start_process_group

        start_process_group(self)
        install_device_mesh(self, self.build_mesh())

    def build_mesh(self) -> "DeviceMesh":
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.root_device.type, (self.world_size,), mesh_dim_names=("data_parallel",))

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # No tensor parallelism: every rank reads its own share of the data.
        return {"num_replicas": self.world_size, "rank": self.global_rank}


class HSDPStrategy(FSDP2Strategy):
    """Hybrid sharding: FSDP2 within a shard group (a node by default), replicas across.

    A 2-D mesh (replicate, shard) = (world / shard_size, shard_size): ranks
    ``k*shard_size .. (k+1)*shard_size - 1`` (the devices of node k when shard_size is
    the devices per node) shard every block between them; each rank's gradient shard
    is reduce-scattered inside its group, then all-reduced with the same shard of the
    other groups. So parameter all-gathers and reduce-scatters stay on the fast
    intra-node links, and only 1/shard_size of the gradients crosses nodes.

    Args:
        shard_size: ranks per shard group; "auto" = devices per node. Must divide the
            world size.
        param_dtype, reduce_dtype, save_distributed_checkpoint: as ``FSDP2Strategy``.
    """

    MESH_DIMS = ("replicate", "shard")

    def __init__(self, shard_size: Union[int, Literal["auto"]] = "auto", param_dtype: str = "auto",
                 reduce_dtype: str = "float32", save_distributed_checkpoint: bool = True,
                 process_group_backend: str | None = None, timeout: timedelta | None = default_pg_timeout) -> None:
        if shard_size != "auto" and (isinstance(shard_size, bool) or not isinstance(shard_size, int)
                                     or shard_size < 1):
            raise ValueError(f"shard_size={shard_size!r} is invalid: must be 'auto' (devices per node) or an "
                             "integer >= 1")
        super().__init__(param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                         save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend, timeout=timeout)
        self.shard_size = shard_size

    def build_mesh(self) -> "DeviceMesh":
        from torch.distributed.device_mesh import init_device_mesh

        shard = self.num_processes if self.shard_size == "auto" else self.shard_size
        if self.world_size % shard:
            raise ValueError(f"shard_size={shard} is invalid: it must divide the world size {self.world_size} "
                             f"({self.num_nodes} nodes x {self.num_processes} devices)")
        return init_device_mesh(self.root_device.type, (self.world_size // shard, shard),
                                mesh_dim_names=self.MESH_DIMS)


# ------------------------------------------------------------------ the registry


@dataclass(frozen=True)
class Layout:
    """Where a run goes: the accelerator ("cpu" or "gpu"), devices per node, nodes."""

    accelerator: str
    devices: int
    num_nodes: int

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes


def _single(layout: Layout, **_: Any) -> "Strategy":
    from lightning.pytorch.strategies import SingleDeviceStrategy

    if layout.world_size != 1:
        raise ValueError(f"strategy='single' runs on one device, got {layout.world_size} (devices × num_nodes); "
                         "use ddp, fsdp, hsdp or deepspeed_stage_2/3 for more")
    return SingleDeviceStrategy(device=torch.device("cuda", 0) if layout.accelerator == "gpu" else torch.device("cpu"))


def _ddp(layout: Layout, **kwargs: Any) -> "Strategy":
    from lightning.pytorch.strategies import DDPStrategy

    return DDPStrategy(**kwargs)


def _fsdp(layout: Layout, **kwargs: Any) -> "Strategy":
    _need_two_devices("fsdp", layout)
    return FSDP2Strategy(**kwargs)


def _hsdp(layout: Layout, **kwargs: Any) -> "Strategy":
    _need_two_devices("hsdp", layout)
    return HSDPStrategy(shard_size=layout.devices, **kwargs)


def _deepspeed(stage: int, layout: Layout, **kwargs: Any) -> "Strategy":
    from lightning.pytorch.strategies import DeepSpeedStrategy

    if layout.accelerator != "gpu":
        raise ValueError(f"strategy='deepspeed_stage_{stage}' needs accelerator='gpu' (Lightning's DeepSpeed is "
                         f"CUDA-only), got {layout.accelerator!r}; on CPU use ddp, fsdp or hsdp")
    return DeepSpeedStrategy(stage=stage, **kwargs)


def _need_two_devices(name: str, layout: Layout) -> None:
    if layout.world_size < 2:
        raise ValueError(f"strategy={name!r} shards over devices × num_nodes >= 2, got 1; use 'single' on one "
                         "device")


# name -> builder(layout, **kwargs) -> a Lightning strategy. The docs of each:
#   single             SingleDeviceStrategy (one CPU or one GPU)
#   ddp                DDPStrategy (replicas; gradients all-reduced)
#   fsdp               FSDP2Strategy: fully_shard per block over every device, bf16 all-gathers on GPUs
#   hsdp               HSDPStrategy: fully_shard within each node, replicated across nodes
#   deepspeed_stage_2  DeepSpeedStrategy(stage=2): optimizer state and gradients sharded (GPU)
#   deepspeed_stage_3  DeepSpeedStrategy(stage=3): parameters sharded too (GPU)
STRATEGIES: dict[str, Callable[..., "Strategy"]] = {
    "single": _single,
    "ddp": _ddp,
    "fsdp": _fsdp,
    "hsdp": _hsdp,
    "deepspeed_stage_2": partial(_deepspeed, 2),
    "deepspeed_stage_3": partial(_deepspeed, 3),
}


def build_strategy(name: str, *, accelerator: str, devices: Any = 1, num_nodes: int = 1,
                   timeout: timedelta | None = None) -> "Strategy":
    """The Lightning strategy a recipe's ``name`` means on ``num_nodes`` × ``devices``."""
    if name not in STRATEGIES:
        raise ValueError(f"strategy={name!r} is invalid: allowed are {', '.join(STRATEGIES)}")
    layout = resolve_layout(accelerator, devices, num_nodes)
    return STRATEGIES[name](layout, **({} if timeout is None else {"timeout": timeout}))


def _check_combination(name: str, accelerator: str, world_size: int) -> None:
    """Raise the builder's error for ``name`` on ``world_size`` devices of one node, if any."""
    build_strategy(name, accelerator=accelerator, devices=world_size)


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


def resolve_layout(accelerator: str, devices: Any = 1, num_nodes: int = 1) -> Layout:
    accelerator = resolve_accelerator(accelerator)
    check("num_nodes", num_nodes, PositiveInt)
    return Layout(accelerator, _device_count(accelerator, devices), num_nodes)


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
