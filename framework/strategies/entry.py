"""One entry of the strategy registry: a name a recipe's ``trainer.strategy`` may hold,
and everything the framework does differently under that strategy.

    build(layout)          the Lightning strategy, or a one-line refusal before any process starts
    footprint(dev, nodes)  what it keeps per device, for `layerdrop recipe`'s memory model
                           (None: the recipe does not propose it there)
    can_skip_step          whether an optimizer step can be skipped (framework/training/nonfinite.py)
    replicates_parameters  whether every rank holds every parameter whole (a frozen model
                           then runs as it is, with nothing gathered)
    local_tensor(t)        this rank's part of a parameter or gradient (the non-finite checks)
    full_tensor(t)         its full value on every rank, a collective (the final export)
    full_shape(t), export_dtype(t)

The defaults here are those of a strategy that keeps plain tensors or FSDP2's
DTensors; an entry overrides what differs. A strategy Lightning was given by class
path (not by one of our names) gets these defaults too (``OTHER``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from lightning.pytorch.strategies import Strategy


@dataclass(frozen=True)
class Footprint:
    """What a strategy keeps on each device besides the activations."""

    shards: int  # the 16 bytes per parameter of fp32 state are split this many ways
    gathers_blocks: bool = False  # FSDP-style: the root and two blocks are gathered at a time
    buckets_gradients: bool = False  # DDP: the all-reduce copies the gradients into flat buckets


@dataclass(frozen=True)
class Layout:
    """Where a run goes: the accelerator ("cpu" or "gpu"), devices per node, nodes."""

    accelerator: str
    devices: int
    num_nodes: int

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes


class NamedStrategy:
    name = "other"
    summary = "a Lightning strategy given by class path or Lightning's own name"
    # The order `layerdrop recipe` tries the strategies it proposes in (less
    # communication first); None: never proposed.
    recipe_preference: int | None = None
    can_skip_step = True
    replicates_parameters = False

    def build(self, layout: Layout, **kwargs: Any) -> "Strategy":
        raise ValueError(f"strategy={self.name!r} is not one the framework builds")

    def strategy_class(self) -> type | None:
        """The Lightning class this entry builds: how a running strategy finds its entry."""
        return None

    def footprint(self, devices: int, nodes: int) -> Footprint | None:
        return None

    def describe(self, devices: int, nodes: int) -> str:
        """How it places the model, in the words of the recipe's comment."""
        return self.summary

    def local_tensor(self, tensor: Any) -> Any:
        """This rank's part of a DTensor (FSDP2); any other tensor as it is."""
        return tensor.to_local() if hasattr(tensor, "to_local") else tensor

    def full_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """The full value of one parameter or buffer, assembled on every rank (a
        collective: every rank calls it for the same tensors in the same order)."""
        from torch.distributed.tensor import DTensor

        return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor

    def full_shape(self, tensor: torch.Tensor) -> tuple[int, ...]:
        return tuple(tensor.shape)

    def export_dtype(self, tensor: torch.Tensor) -> torch.dtype:
        return tensor.dtype

    def __repr__(self) -> str:
        return f"<strategy {self.name}>"


OTHER = NamedStrategy()

__all__ = ["Footprint", "Layout", "NamedStrategy", "OTHER"]
