"""FSDP2 and HSDP as Lightning strategies, with a mixed-precision policy.

Lightning's ModelParallelStrategy builds only a data x tensor mesh: ``FSDP2Strategy``
shards over every device (a 1-D mesh), ``HSDPStrategy`` within a shard group and
replicated across groups (a 2-D mesh).

FSDP2 mixed precision (``MixedPrecisionPolicy``, the same on every block and the root):
the sharded parameters, their gradients and AdamW's state stay float32 (the master
weights); before a block runs, its shards are all-gathered in ``param_dtype`` (bf16 on
GPUs: half the bytes of float32), and its gradients are reduce-scattered in
``reduce_dtype`` (float32 by default, so the sum over ranks loses nothing). The cast
happens once per all-gather, at the module boundary, where autocast would cast every
weight at every matmul.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy

from framework.checkpoint.resume import WorldSizeError
from framework.checkpoint.saved_size import dcp_part_bytes, torch_save_bytes
from framework.checkpoint.sharded.dcp import LIGHTNING_META
from framework.files.disk_space import DiskFull, free_bytes, is_disk_full, on_disk
from framework.strategies.lightning_internals import saves_distributed_checkpoint
from framework.strategies.parallelize import HSDP_MESH_DIMS

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.precision import Precision
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

PARAM_DTYPES = ("auto", "bfloat16", "float32")  # "auto": bfloat16 on GPUs, float32 on CPUs
REDUCE_DTYPES = ("float32", "bfloat16")
# Lightning precisions that keep float32 weights in the optimizer (the "-true" low
# precisions would convert the sharded master weights themselves).
FSDP2_PRECISIONS = ("32-true", "bf16-mixed")


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
        from framework.strategies.lightning_internals import install_device_mesh, start_process_group

        start_process_group(self)
        install_device_mesh(self, self.build_mesh())

    def build_mesh(self) -> "DeviceMesh":
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(self.root_device.type, (self.world_size,), mesh_dim_names=("data_parallel",))

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # No tensor parallelism: every rank reads its own share of the data.
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """Lightning's folder of shards (the model and optimizer through
        torch.distributed.checkpoint, then rank 0's ``meta.pt`` with everything else),
        decided for the whole job:

        - the room is checked first, against every rank's shards, DCP's ``.metadata``
          index and ``meta.pt`` (framework/checkpoint/saved_size.py): a save that cannot
          fit is refused on every rank before anything is written;
        - ``meta.pt`` is written through an open file, so that a full disk keeps its
          errno (torch's own file writer turns it into "basic_ios::clear: iostream error");
        - a write that fails on one rank fails on every rank, as ``DiskFull`` when the
          disk was full: rank 0 writes ``meta.pt`` alone, and a failure there once left
          the other ranks in Lightning's barrier after the save, the job hanging.
        """
        if storage_options is not None or not saves_distributed_checkpoint(self):
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        from torch.distributed.checkpoint import save

        path = Path(self.broadcast(str(filepath)))
        shards = {"state_dict": checkpoint.pop("state_dict"),
                  **{f"optimizer_{index}": state for index, state in enumerate(checkpoint.pop("optimizer_states", []))}}
        needed, free = self._room(shards, checkpoint, path)
        if needed > free:
            raise DiskFull(f"not enough disk space for {path}: the checkpoint needs {needed:,} bytes (the shards of "
                           f"{self.world_size} ranks, the DCP index and {LIGHTNING_META}), {free:,} are free")
        failure: BaseException | None = None
        try:
            if path.is_file():
                path.unlink()
            path.mkdir(parents=True, exist_ok=True)
            save(shards, checkpoint_id=path)
            if self.is_global_zero:
                with open(path / LIGHTNING_META, "wb") as handle:
                    torch.save(checkpoint, handle)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # DCP raises CheckpointException, a BaseException, on every rank
            failure = err
        self._agree(failure, path, needed)

    def _room(self, shards: dict[str, Any], rest: dict[str, Any], path: Path) -> tuple[int, int]:
        """(bytes the save needs on disk, bytes free there), the same on every rank."""
        data, index = dcp_part_bytes(shards, replicated=self.is_global_zero)
        meta = torch_save_bytes(rest) if self.is_global_zero else 0
        free = free_bytes(path) if self.is_global_zero else 0
        total = self.reduce(torch.tensor([data + index + meta, free], dtype=torch.float64, device=self.root_device),
                            reduce_op="sum")
        files = self.world_size + 3  # a shard file per rank, .metadata, meta.pt and the folder itself
        return on_disk(int(total[0]), path, files), int(total[1])

    def _agree(self, failure: BaseException | None, path: Path, needed: int) -> None:
        """Every rank learns whether any rank's part of the save failed, and all raise."""
        outcome = 0 if failure is None else (1 if is_disk_full(failure) else 2)
        free = free_bytes(path) if self.is_global_zero else 0
        outcomes = self.all_gather(torch.tensor([outcome, free], dtype=torch.float64, device=self.root_device))
        outcomes = outcomes.reshape(self.world_size, 2).cpu()
        if not outcomes[:, 0].any():
            return
        if (outcomes[:, 0] == 1).any():
            raise DiskFull(f"disk full while writing {path}: about {needed:,} bytes needed, "
                           f"{int(outcomes[0, 1]):,} free") from failure
        if failure is not None:
            raise failure
        failed = [rank for rank in range(self.world_size) if outcomes[rank, 0]]
        raise RuntimeError(f"saving {path} failed on rank(s) {', '.join(map(str, failed))} (their error above)")


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

    MESH_DIMS = HSDP_MESH_DIMS

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
            raise WorldSizeError(f"shard_size={shard} is invalid: it must divide the world size {self.world_size} "
                                 f"({self.num_nodes} nodes x {self.num_processes} devices)")
        return init_device_mesh(self.root_device.type, (self.world_size // shard, shard),
                                mesh_dim_names=self.MESH_DIMS)


__all__ = ["FSDP2Strategy", "HSDPStrategy", "mixed_precision_policy", "mixed_precision_of", "check_dtype_names",
           "PARAM_DTYPES", "REDUCE_DTYPES", "FSDP2_PRECISIONS"]
