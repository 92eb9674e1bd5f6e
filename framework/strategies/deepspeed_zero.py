"""DeepSpeed ZeRO-2 / ZeRO-3 through Lightning's DeepSpeedStrategy (GPU), and what the
framework does differently under it.

- Its engine runs the optimizer step itself and cannot skip one: a non-finite step
  stops the run (framework/training/nonfinite.py) instead of being skipped.
- It trains low-precision copies of fp32 master weights: the export writes the
  masters, gathered with ``safe_get_full_fp32_param`` (ZeRO-3: a parameter is an empty
  placeholder on each rank, its shape in ``ds_shape``, this rank's partition in
  ``ds_tensor``).
- Its checkpoints are DeepSpeed folders (``latest`` + ``<tag>/*_states.pt``).
- `layerdrop recipe` does not propose it: its memory (bf16 weights beside fp32
  partitions, the engine's buffers) is not in the memory model, which was checked for
  DDP and FSDP2 only.

``from lightning.pytorch.strategies import DeepSpeedStrategy`` does not import
deepspeed; deepspeed itself is imported only where a running DeepSpeed job needs it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from framework.strategies.entry import Layout, NamedStrategy

if TYPE_CHECKING:
    from lightning.pytorch.strategies import Strategy

SUMMARIES = {2: "optimizer state and gradients sharded (GPU)", 3: "parameters sharded too (GPU)"}


class DeepSpeedZero(NamedStrategy):
    can_skip_step = False

    def __init__(self, stage: int) -> None:
        self.stage = stage
        self.name = f"deepspeed_stage_{stage}"
        self.replicates_parameters = stage < 3  # ZeRO-3 partitions the parameters too
        self.summary = f"DeepSpeedStrategy(stage={stage}): {SUMMARIES[stage]}"

    def build(self, layout: Layout, **kwargs: Any) -> "Strategy":
        from lightning.pytorch.strategies import DeepSpeedStrategy

        if layout.accelerator != "gpu":
            raise ValueError(f"strategy={self.name!r} needs accelerator='gpu' (Lightning's DeepSpeed is "
                             f"CUDA-only), got {layout.accelerator!r}; on CPU use ddp, fsdp or hsdp")
        return DeepSpeedStrategy(stage=self.stage, **kwargs)

    def strategy_class(self) -> type:
        from lightning.pytorch.strategies import DeepSpeedStrategy

        return DeepSpeedStrategy

    def local_tensor(self, tensor: Any) -> Any:
        return super().local_tensor(getattr(tensor, "ds_tensor", tensor))  # ZeRO-3: this rank's partition

    def full_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        if not (hasattr(tensor, "ds_id") or hasattr(tensor, "_hp_mapping")):
            return super().full_tensor(tensor)
        from deepspeed.utils import safe_get_full_fp32_param

        full = safe_get_full_fp32_param(tensor)
        if full is not None:
            return full
        if hasattr(tensor, "ds_id"):
            import deepspeed

            with deepspeed.zero.GatheredParameters([tensor]):
                return tensor.data.clone()
        return tensor

    def full_shape(self, tensor: torch.Tensor) -> tuple[int, ...]:
        return tuple(getattr(tensor, "ds_shape", None) or tensor.shape)  # ZeRO-3 keeps an empty placeholder

    def export_dtype(self, tensor: torch.Tensor) -> torch.dtype:
        return torch.float32 if tensor.is_floating_point() else tensor.dtype


def full_parameters(module: nn.Module) -> AbstractContextManager:
    """A context in which ``module``'s parameters hold their full values, and what rank
    0 writes to them persists: for initialising weights after construction.

    Under ZeRO-3 the parameters are partitioned as they are created (Lightning builds
    the model inside ``deepspeed.zero.Init``), so each rank holds an empty placeholder;
    writing to it would silently do nothing. Elsewhere (single device, DDP, ZeRO-2,
    FSDP2 before ``fully_shard``) this is a no-op.
    """
    partitioned = [p for p in module.parameters() if hasattr(p, "ds_id")]
    if not partitioned:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(partitioned, modifier_rank=0)


__all__ = ["DeepSpeedZero", "full_parameters"]
