"""framework/strategies/registry.py and entry.py: every registry entry owns what the
framework does differently under its strategy, and a running strategy finds its entry.

The behaviours themselves run for real in tests/distributed/ (the final export of each
form, the non-finite checks on 2 ranks, the memory model in tests/test_device_memory.py);
here: that each entry says what its strategy does, and that nothing outside the
registry keeps a second table of strategy names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, ModelParallelStrategy, SingleDeviceStrategy

from framework.device_memory import Footprint
from framework.strategies import STRATEGIES, FSDP2Strategy, HSDPStrategy, build_strategy, entry_of
from framework.strategies.entry import OTHER

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


def test_each_entry_names_the_checkpoint_form_it_writes():
    forms = {name: entry.checkpoint_form(built) for name, entry, built in (
        ("single", STRATEGIES["single"], SingleDeviceStrategy(device=torch.device("cpu"))),
        ("ddp", STRATEGIES["ddp"], DDPStrategy()),
        ("fsdp", STRATEGIES["fsdp"], FSDP2Strategy()),
        ("fsdp one file", STRATEGIES["fsdp"], FSDP2Strategy(save_distributed_checkpoint=False)),
        ("hsdp", STRATEGIES["hsdp"], HSDPStrategy()))}
    assert forms == {"single": "lightning", "ddp": "lightning", "fsdp": "dcp", "fsdp one file": "lightning",
                     "hsdp": "dcp"}
    assert STRATEGIES["deepspeed_stage_3"].checkpoint_form(None) == "deepspeed"


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
