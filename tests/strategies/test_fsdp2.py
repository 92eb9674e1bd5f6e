"""framework/strategies/fsdp2.py: FSDP2's mixed-precision policy, the strategies' dtype,
shard-size and precision checks, and the private Lightning names they rely on."""

from __future__ import annotations

import pytest
import torch

from framework.strategies import FSDP2Strategy, HSDPStrategy, mixed_precision_of, mixed_precision_policy



def test_policy_is_bf16_gathers_and_fp32_reductions_on_gpu_and_none_on_cpu():
    gpu = mixed_precision_policy(device_type="cuda")
    assert (gpu.param_dtype, gpu.reduce_dtype) == (torch.bfloat16, torch.float32)
    cpu = mixed_precision_policy(device_type="cpu")
    assert (cpu.param_dtype, cpu.reduce_dtype) == (None, None)  # FSDP2 casts nothing
    asked = mixed_precision_policy("bfloat16", "float32", device_type="cpu")
    assert (asked.param_dtype, asked.reduce_dtype) == (torch.bfloat16, torch.float32)
    fp32 = mixed_precision_policy("float32", device_type="cuda")
    assert (fp32.param_dtype, fp32.reduce_dtype) == (None, None)
    low_reduce = mixed_precision_policy("bfloat16", "bfloat16", device_type="cuda")
    assert low_reduce.reduce_dtype == torch.bfloat16


@pytest.mark.parametrize("kwargs, message", [
    ({"param_dtype": "bf16"}, "param_dtype='bf16' is invalid: allowed are auto, bfloat16, float32"),
    ({"param_dtype": "float16"}, "param_dtype='float16' is invalid"),
    ({"reduce_dtype": "auto"}, "reduce_dtype='auto' is invalid: allowed are float32, bfloat16"),
])
def test_bad_dtype_names_are_refused_when_the_strategy_is_built(kwargs, message):
    for cls in (FSDP2Strategy, HSDPStrategy):
        with pytest.raises(ValueError, match=message):
            cls(**kwargs)


@pytest.mark.parametrize("shard_size", [0, -1, 2.5, True, "node"])
def test_bad_shard_size_is_refused(shard_size):
    with pytest.raises(ValueError, match=r"shard_size=.* is invalid: must be 'auto' \(devices per node\)"):
        HSDPStrategy(shard_size=shard_size)


def test_shard_size_must_divide_the_world():
    from lightning.fabric.plugins.environments import LightningEnvironment

    strategy = HSDPStrategy(shard_size=3)
    strategy.parallel_devices, strategy.num_nodes = [torch.device("cpu")] * 2, 2
    strategy.cluster_environment = LightningEnvironment()
    strategy.cluster_environment.set_world_size(4)
    with pytest.raises(ValueError, match=r"shard_size=3 is invalid: it must divide the world size 4 "
                                         r"\(2 nodes x 2 devices\)"):
        strategy.build_mesh()


@pytest.mark.parametrize("precision", ["bf16-true", "16-true"])
def test_low_precision_master_weights_are_refused_before_launch(precision):
    import lightning.pytorch as pl

    with pytest.raises(ValueError, match=rf"precision='{precision}' is invalid with strategy HSDPStrategy: "
                                         r"allowed are 32-true, bf16-mixed"):
        pl.Trainer(accelerator="cpu", devices=2, strategy=HSDPStrategy(), precision=precision, logger=False)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_fp32_and_bf16_autocast_compose_with_the_policy(precision):
    import lightning.pytorch as pl

    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=FSDP2Strategy(param_dtype="bfloat16"),
                         precision=precision, logger=False)
    assert trainer.strategy.precision_plugin.precision == precision


def test_the_policy_reaches_the_module_only_through_our_strategies():
    import lightning.pytorch as pl

    module = pl.LightningModule()
    assert mixed_precision_of(module) is None  # no Trainer
    strategy = FSDP2Strategy(param_dtype="bfloat16", reduce_dtype="float32")
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False)
    module.trainer = trainer
    policy = mixed_precision_of(module)
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    module.trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)
    assert mixed_precision_of(module) is None


def test_the_private_lightning_names_we_use_still_exist():
    """framework/strategies/lightning_internals.py reaches into these; a Lightning upgrade that
    renames one must fail here, not inside a multi-process run."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import ModelParallelStrategy

    assert callable(getattr(ModelParallelStrategy, "_setup_distributed", None))
    assert "_device_mesh" in vars(ModelParallelStrategy())
    assert "_device_mesh" in vars(pl.LightningModule())
