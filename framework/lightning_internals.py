"""The private Lightning calls this project relies on, in one place.

Each function names the Lightning internal it uses; tests/test_strategies.py checks
that they still exist, so a Lightning upgrade that renames one fails there, loudly,
instead of deep inside a multi-process run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.distributed.device_mesh import DeviceMesh


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

