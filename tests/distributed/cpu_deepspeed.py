"""Test-only: Lightning's DeepSpeedStrategy with its CUDA checks lifted, so ZeRO-2/3
run on CPU processes over gloo.

Lightning refuses DeepSpeed without a CUDA accelerator, and so does
``framework.strategies.build_strategy``; DeepSpeed's ZeRO stages themselves run on
CPU tensors. Never import this outside tests: a real run belongs on GPUs.
"""

from __future__ import annotations

from unittest import mock

import torch
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.pytorch.strategies.ddp import DDPStrategy


class CPUDeepSpeedStrategy(DeepSpeedStrategy):
    def __init__(self, stage: int = 2, **kwargs) -> None:
        kwargs.setdefault("process_group_backend", "gloo")
        super().__init__(stage=stage, **kwargs)

    def setup_environment(self) -> None:
        # Skip DeepSpeedStrategy's "only supported on CUDA GPUs" check, keep the rest.
        DDPStrategy.setup_environment(self)

    def setup_distributed(self) -> None:
        # The device-index check compares CUDA indices with local ranks: CPUs have none.
        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()

    def _init_deepspeed_distributed(self) -> None:
        # On CPU DeepSpeed JIT-compiles a shared-memory all-reduce with g++ at init
        # (30 s to minutes, racing between ranks). Only its inference all-reduce uses
        # it; ZeRO training goes through torch.distributed, as it does on GPUs.
        with mock.patch("deepspeed.comm.torch.build_shm_op", return_value=None):
            super()._init_deepspeed_distributed()

    @property
    def root_device(self) -> torch.device:
        # DeepSpeed reads the local rank from the device index; CPU tensors ignore it.
        return torch.device("cpu", self.local_rank)
