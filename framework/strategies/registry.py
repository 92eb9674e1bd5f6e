"""The strategies a recipe names: ``STRATEGIES``, name -> entry (framework/strategies/entry.py).

    single             SingleDeviceStrategy (one CPU or one GPU)
    ddp                DDPStrategy (replicas; gradients all-reduced)
    fsdp               FSDP2Strategy: fully_shard per block over every device, bf16 all-gathers on GPUs
    hsdp               HSDPStrategy: fully_shard within each node, replicated across nodes
    deepspeed_stage_2  DeepSpeedStrategy(stage=2): optimizer state and gradients sharded (GPU)
    deepspeed_stage_3  DeepSpeedStrategy(stage=3): parameters sharded too (GPU)

Each entry builds its Lightning strategy (rejecting a combination that cannot run
before any process is started) and says how it behaves: what it keeps per device
(`layerdrop recipe`), how a full tensor is gathered, whether a step can be skipped,
which checkpoint form it writes. Adding a strategy is adding one entry here.
``entry_of`` finds the entry of a running strategy.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from framework.checkpoint.resume import WorldSizeError
from framework.config import PositiveInt, check
from framework.strategies.deepspeed_zero import DeepSpeedZero
from framework.strategies.entry import OTHER, Footprint, Layout, NamedStrategy
from framework.strategies.fsdp2 import FSDP2Strategy, HSDPStrategy

if TYPE_CHECKING:
    from lightning.pytorch.strategies import Strategy

ACCELERATORS = ("cpu", "gpu", "cuda", "auto")


class Single(NamedStrategy):
    name, summary, recipe_preference = "single", "one device", 0
    replicates_parameters = True

    def build(self, layout: Layout, **_: Any) -> "Strategy":
        from lightning.pytorch.strategies import SingleDeviceStrategy

        if layout.world_size != 1:
            raise WorldSizeError(f"strategy='single' runs on one device, got {layout.world_size} (devices × "
                                 "num_nodes); use ddp, fsdp, hsdp or deepspeed_stage_2/3 for more")
        return SingleDeviceStrategy(device=torch.device("cuda", 0) if layout.accelerator == "gpu"
                                    else torch.device("cpu"))

    def strategy_class(self) -> type:
        from lightning.pytorch.strategies import SingleDeviceStrategy

        return SingleDeviceStrategy

    def footprint(self, devices: int, nodes: int) -> Footprint | None:
        return Footprint(shards=1) if devices * nodes == 1 else None


class DDP(NamedStrategy):
    name, summary, recipe_preference = "ddp", "full replicas, gradients all-reduced", 1
    replicates_parameters = True

    def build(self, layout: Layout, **kwargs: Any) -> "Strategy":
        from lightning.pytorch.strategies import DDPStrategy

        return DDPStrategy(**kwargs)

    def strategy_class(self) -> type:
        from lightning.pytorch.strategies import DDPStrategy

        return DDPStrategy

    def footprint(self, devices: int, nodes: int) -> Footprint | None:
        return Footprint(shards=1, buckets_gradients=True) if devices * nodes > 1 else None


class FSDP(NamedStrategy):
    name, summary, recipe_preference = "fsdp", "FSDP2 over every device", 3

    def build(self, layout: Layout, **kwargs: Any) -> "Strategy":
        _need_two_devices(self.name, layout)
        return FSDP2Strategy(**kwargs)

    def strategy_class(self) -> type:
        return FSDP2Strategy

    def footprint(self, devices: int, nodes: int) -> Footprint | None:
        world = devices * nodes
        return Footprint(shards=world, gathers_blocks=True) if world > 1 else None

    def describe(self, devices: int, nodes: int) -> str:
        return f"FSDP2 over all {devices * nodes} devices"


class HSDP(FSDP):
    name, summary, recipe_preference = "hsdp", "FSDP2 within each node, replicated across nodes", 2

    def build(self, layout: Layout, **kwargs: Any) -> "Strategy":
        _need_two_devices(self.name, layout)
        return HSDPStrategy(shard_size=layout.devices, **kwargs)

    def strategy_class(self) -> type:
        return HSDPStrategy

    def footprint(self, devices: int, nodes: int) -> Footprint | None:
        # On one node it is fsdp; with one device per node nothing is sharded or gathered.
        return Footprint(shards=devices, gathers_blocks=devices > 1) if nodes > 1 else None

    def describe(self, devices: int, nodes: int) -> str:
        return f"sharded over each node's {devices} devices, replicated across {nodes} nodes"


def _need_two_devices(name: str, layout: Layout) -> None:
    if layout.world_size < 2:
        raise WorldSizeError(f"strategy={name!r} shards over devices × num_nodes >= 2, got 1; use 'single' on one "
                             "device")


STRATEGIES: dict[str, NamedStrategy] = {entry.name: entry for entry in
                                        (Single(), DDP(), FSDP(), HSDP(), DeepSpeedZero(2), DeepSpeedZero(3))}


def entry_of(strategy: "Strategy") -> NamedStrategy:
    """The entry of a running Lightning strategy: the one whose class is nearest in its
    class hierarchy (HSDPStrategy is an FSDP2Strategy, a test's CPU DeepSpeed subclass
    a DeepSpeedStrategy); ``OTHER``'s defaults for a strategy none of them builds."""
    for cls in type(strategy).__mro__:
        for entry in STRATEGIES.values():
            if entry.strategy_class() is cls:
                return entry
    return OTHER


def build_strategy(name: str, *, accelerator: str, devices: Any = 1, num_nodes: int = 1,
                   timeout: timedelta | None = None) -> "Strategy":
    """The Lightning strategy a recipe's ``name`` means on ``num_nodes`` × ``devices``."""
    if name not in STRATEGIES:
        raise ValueError(f"strategy={name!r} is invalid: allowed are {', '.join(STRATEGIES)}")
    layout = resolve_layout(accelerator, devices, num_nodes)
    return STRATEGIES[name].build(layout, **({} if timeout is None else {"timeout": timeout}))


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


__all__ = ["STRATEGIES", "entry_of", "build_strategy", "resolve_accelerator", "resolve_layout", "precision_for",
           "ACCELERATORS"]
