"""The one home of the private Lightning APIs this project relies on.

Lightning's underscore names are not its public API: a release may rename, remove or
change them without notice, and code that uses them then breaks in ways no type
checker sees. So every such use is meant to sit here, in a small function named for
what it does, and every private name the project touches is listed in
``PRIVATE_API`` with the parameters seen on the pinned Lightning (2.6.6).
tests/strategies/test_lightning_internals.py checks each entry against the installed Lightning
(and fails naming it when an upgrade changed it), and scans the code for private
Lightning names that are not listed here.

Prefer the public API where one exists: the end of an optimizer step, for example,
is read from ``trainer.global_step`` (framework/training/callbacks.py), not from the fit loop's
private ``_accumulated_batches_reached``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.distributed.device_mesh import DeviceMesh

# "module:Class.name" -> the parameter names of the method, or None for an instance
# attribute that the class sets in its own code.
PRIVATE_API: dict[str, tuple[str, ...] | None] = {
    # PretrainCLI builds the Trainer with the recipe's named strategy (framework/training/pretrain.py).
    "lightning.pytorch.cli:LightningCLI._instantiate_trainer": ("self", "config", "callbacks"),
    # Our own device meshes (HSDP) on Lightning's ModelParallelStrategy (issue #12).
    "lightning.pytorch.strategies:ModelParallelStrategy._setup_distributed": ("self",),
    "lightning.pytorch.strategies:ModelParallelStrategy._device_mesh": None,
    "lightning.pytorch:LightningModule._device_mesh": None,
    # Which checkpoint form an FSDP2 strategy writes (framework/strategies/registry.py).
    "lightning.pytorch.strategies:ModelParallelStrategy._save_distributed_checkpoint": None,
}


def start_process_group(strategy: "ModelParallelStrategy") -> None:
    """ModelParallelStrategy._setup_distributed: the device, the ranks and the process
    group, without the (data_parallel, tensor_parallel) mesh its setup_environment
    builds next (our strategies build their own mesh)."""
    strategy._setup_distributed()


def install_device_mesh(strategy: "ModelParallelStrategy", mesh: "DeviceMesh") -> None:
    """What ModelParallelStrategy.setup_environment does with its mesh: keep it on the
    strategy (``strategy.device_mesh``) and hand it to the LightningModule, whose
    ``device_mesh`` property ``configure_model`` reads."""
    strategy._device_mesh = mesh
    strategy.lightning_module._device_mesh = mesh


def saves_distributed_checkpoint(strategy: "ModelParallelStrategy") -> bool:
    """Whether the strategy saves a sharded DCP folder (its save_distributed_checkpoint
    argument) rather than one consolidated file."""
    return bool(strategy._save_distributed_checkpoint)


__all__ = ["PRIVATE_API", "start_process_group", "install_device_mesh", "saves_distributed_checkpoint"]
