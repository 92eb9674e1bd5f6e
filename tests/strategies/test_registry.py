"""framework/strategies/registry.py and entry.py: every registry entry owns what the
framework does differently under its strategy, and a running strategy finds its entry;
names build the Lightning strategies they mean, and bad names, devices, nodes and
accelerators are refused in one line.

The behaviours themselves run for real in tests/distributed/ (the final export of each
form, the non-finite checks on 2 ranks, the memory model in tests/recipes/test_device_memory.py);
here: that each entry says what its strategy does, and that nothing outside the
registry keeps a second table of strategy names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, ModelParallelStrategy, SingleDeviceStrategy

from framework.strategies import (STRATEGIES, FSDP2Strategy, HSDPStrategy, build_strategy, entry_of, precision_for,
                                  resolve_accelerator)
from framework.strategies.entry import OTHER, Footprint

FRAMEWORK = Path(__file__).resolve().parents[2] / "framework"


def test_a_built_strategy_finds_the_entry_that_built_it():
    for name, devices, nodes in (("single", 1, 1), ("ddp", 2, 1), ("fsdp", 2, 1), ("hsdp", 2, 2)):
        assert entry_of(build_strategy(name, accelerator="cpu", devices=devices, num_nodes=nodes)) is STRATEGIES[name]


def test_a_subclass_finds_its_nearest_entry_and_a_foreign_strategy_the_defaults():
    class CPUDeepSpeed(DeepSpeedStrategy):  # what tests/distributed/cpu_deepspeed.py does
        pass

    pytest.importorskip("deepspeed")
    assert entry_of(CPUDeepSpeed(stage=3)).name.startswith("deepspeed_stage_")
    assert entry_of(DDPStrategy(start_method="spawn")) is STRATEGIES["ddp"]
    assert entry_of(ModelParallelStrategy()) is OTHER  # Lightning's own, by class path
    assert issubclass(HSDPStrategy, FSDP2Strategy) and entry_of(HSDPStrategy()) is STRATEGIES["hsdp"]


def test_only_deepspeed_cannot_skip_a_step():
    assert {name for name, entry in STRATEGIES.items() if not entry.can_skip_step} == \
        {"deepspeed_stage_2", "deepspeed_stage_3"}
    assert OTHER.can_skip_step


def test_the_strategies_that_keep_every_parameter_whole_on_every_rank():
    # a frozen backbone runs unsharded under these (eval/adapters/fit.py offers only them)
    assert [name for name, entry in STRATEGIES.items() if entry.replicates_parameters] == [
        "single", "ddp", "deepspeed_stage_2"]
    assert not OTHER.replicates_parameters


@pytest.mark.parametrize("devices, nodes, proposed", [
    (1, 1, {"single": Footprint(1)}),
    (8, 1, {"ddp": Footprint(1, buckets_gradients=True), "fsdp": Footprint(8, gathers_blocks=True)}),
    (8, 2, {"ddp": Footprint(1, buckets_gradients=True), "hsdp": Footprint(8, gathers_blocks=True),
            "fsdp": Footprint(16, gathers_blocks=True)}),
    (1, 4, {"ddp": Footprint(1, buckets_gradients=True), "hsdp": Footprint(1),
            "fsdp": Footprint(4, gathers_blocks=True)}),
])
def test_the_footprints_the_recipe_prices(devices, nodes, proposed):
    known = ("single", "ddp", "fsdp", "hsdp", "deepspeed_stage_2", "deepspeed_stage_3")
    found = {name: STRATEGIES[name].footprint(devices, nodes) for name in known
             if STRATEGIES[name].footprint(devices, nodes) is not None}
    assert found == proposed
    assert all(STRATEGIES[name].recipe_preference is not None for name in found)


def test_plain_tensors_are_their_own_full_and_local_values():
    weight = torch.randn(3, 4)
    for entry in STRATEGIES.values():
        assert entry.full_tensor(weight) is weight and entry.local_tensor(weight) is weight
        assert entry.full_shape(weight) == (3, 4)
    assert STRATEGIES["ddp"].export_dtype(weight.bfloat16()) == torch.bfloat16
    # DeepSpeed trains low-precision copies of fp32 master weights: the export writes the masters.
    assert STRATEGIES["deepspeed_stage_2"].export_dtype(weight.bfloat16()) == torch.float32
    assert STRATEGIES["deepspeed_stage_2"].export_dtype(torch.zeros(2, dtype=torch.long)) == torch.long


def test_deepspeed_is_used_only_by_its_entry_and_the_checkpoint_forms_that_read_its_folders():
    """In code (imports and names, not prose): a DeepSpeedStrategy check or a deepspeed
    import anywhere else would be a second home for what the entry owns."""
    offenders = []
    for path in sorted(FRAMEWORK.rglob("*.py")):
        where = path.relative_to(FRAMEWORK)
        if where.name == "deepspeed_zero.py" or "checkpoint" in where.parts[0]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                       else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            names = ([alias.name for alias in node.names] if isinstance(node, ast.ImportFrom)
                     else [node.id] if isinstance(node, ast.Name) else [node.attr] if isinstance(node, ast.Attribute)
                     else [])
            if any(m.split(".")[0] == "deepspeed" for m in modules) or "DeepSpeedStrategy" in names:
                offenders.append(f"{where}:{node.lineno}")
    assert offenders == []


# ------------------------------------------------------------------ name mapping


def test_single_is_one_device():
    strategy = build_strategy("single", accelerator="cpu", devices=1)
    assert isinstance(strategy, SingleDeviceStrategy)
    assert strategy.root_device == torch.device("cpu")


def test_ddp_maps_to_lightning_ddp():
    assert type(build_strategy("ddp", accelerator="cpu", devices=2)) is DDPStrategy


def test_fsdp_is_fsdp2_over_every_device_of_every_node():
    strategy = build_strategy("fsdp", accelerator="cpu", devices=2, num_nodes=3)
    assert type(strategy) is FSDP2Strategy
    assert (strategy.param_dtype, strategy.reduce_dtype) == ("auto", "float32")
    assert strategy.distributed_sampler_kwargs is not None


def test_hsdp_shards_within_a_node_by_default():
    strategy = build_strategy("hsdp", accelerator="gpu", devices=8, num_nodes=2)
    assert type(strategy) is HSDPStrategy and strategy.shard_size == 8


@pytest.mark.parametrize("name, stage", [("deepspeed_stage_2", 2), ("deepspeed_stage_3", 3)])
def test_deepspeed_stages_on_gpu(name, stage):
    pytest.importorskip("deepspeed")
    strategy = build_strategy(name, accelerator="gpu", devices=8, num_nodes=2)
    assert isinstance(strategy, DeepSpeedStrategy)
    assert strategy.config["zero_optimization"]["stage"] == stage


def test_every_advertised_name_builds_somewhere():
    pytest.importorskip("deepspeed")
    for name in STRATEGIES:
        devices = 1 if name == "single" else 2
        accelerator = "gpu" if name.startswith("deepspeed") else "cpu"
        assert build_strategy(name, accelerator=accelerator, devices=devices) is not None


def test_precision_is_bf16_mixed_on_gpu_and_fp32_on_cpu():
    assert precision_for("gpu") == "bf16-mixed"
    assert precision_for("cuda") == "bf16-mixed"
    assert precision_for("cpu") == "32-true"
    assert precision_for("auto") == ("bf16-mixed" if torch.cuda.is_available() else "32-true")


def test_auto_accelerator_follows_cuda():
    assert resolve_accelerator("auto") == ("gpu" if torch.cuda.is_available() else "cpu")


# ------------------------------------------------------------------------ errors


@pytest.mark.parametrize("name", ["fsdp1", "FSDP", "deepspeed", "ddp_spawn", "", "zero3"])
def test_unknown_name_names_the_value_and_the_allowed_ones(name):
    with pytest.raises(ValueError) as err:
        build_strategy(name, accelerator="cpu", devices=2)
    message = str(err.value)
    assert repr(name) in message and all(allowed in message for allowed in STRATEGIES)
    assert "\n" not in message


@pytest.mark.parametrize("name", ["deepspeed_stage_2", "deepspeed_stage_3"])
def test_deepspeed_on_cpu_is_refused(name):
    with pytest.raises(ValueError, match=rf"strategy='{name}' needs accelerator='gpu'.*got 'cpu'"):
        build_strategy(name, accelerator="cpu", devices=2)


@pytest.mark.parametrize("name", ["fsdp", "hsdp"])
def test_sharding_on_one_device_is_refused(name):
    with pytest.raises(ValueError, match=f"strategy='{name}' shards over .* >= 2, got 1"):
        build_strategy(name, accelerator="cpu", devices=1, num_nodes=1)


def test_single_on_several_devices_is_refused():
    with pytest.raises(ValueError, match="strategy='single' runs on one device, got 4"):
        build_strategy("single", accelerator="cpu", devices=2, num_nodes=2)


@pytest.mark.parametrize("devices", [0, -2, 1.5, True, "two", "0", []])
def test_bad_device_count_is_refused(devices):
    with pytest.raises(ValueError, match=r"devices=.* is invalid: must be a count >= 1, a list of device indices"):
        build_strategy("ddp", accelerator="cpu", devices=devices)


@pytest.mark.parametrize("devices, per_node", [("2", 2), ("0,1,2", 3), ([0, 3], 2), (2, 2)])
def test_devices_are_read_as_lightning_reads_them(devices, per_node):
    """A command line passes devices as a string; Lightning takes counts and index lists."""
    assert build_strategy("hsdp", accelerator="gpu", devices=devices, num_nodes=2).shard_size == per_node


@pytest.mark.parametrize("name", ["fsdp", "hsdp"])
def test_sharding_over_nodes_of_one_device_each_is_allowed(name):
    assert build_strategy(name, accelerator="cpu", devices="1", num_nodes=2) is not None


def test_bad_node_count_is_refused():
    with pytest.raises(ValueError, match=r"num_nodes=0 is invalid"):
        build_strategy("ddp", accelerator="cpu", devices=2, num_nodes=0)


def test_unknown_accelerator_is_refused():
    with pytest.raises(ValueError, match=r"accelerator='tpu' is invalid: allowed are cpu, gpu, cuda, auto"):
        precision_for("tpu")
