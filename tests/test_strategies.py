"""framework/strategies (the package) in one process: the name -> strategy mapping, its errors,
and ``parallelize`` without a mesh (activation checkpointing keeps names and gradients).

Multi-process runs of every strategy are in tests/distributed/.
"""

from __future__ import annotations

import copy

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy

from framework.config import LayerDropoutConfig, ModelConfig
from framework.layer_dropout import DropPlan, StepKey, plan
from framework.model import Decoder
from framework.strategies import (STRATEGIES, FSDP2Strategy, HSDPStrategy, build_strategy, full_parameters,
                                  mixed_precision_of, mixed_precision_policy, parallelize, precision_for,
                                  resolve_accelerator)


def tiny_decoder() -> Decoder:
    torch.manual_seed(0)
    return Decoder(ModelConfig(vocab_size=128, d_model=32, n_layers=4, n_heads=4, max_seq_len=32, attention="sdpa"))


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


def test_parallelize_needs_blocks():
    with pytest.raises(ValueError, match="needs a Decoder with a `blocks` ModuleList; got Linear"):
        parallelize(torch.nn.Linear(2, 2), activation_checkpointing=True)


# ------------------------------------------------------------------ parallelize


def test_without_a_mesh_or_options_the_model_is_untouched():
    decoder = tiny_decoder()
    before = {k: v.clone() for k, v in decoder.state_dict().items()}
    assert parallelize(decoder) is decoder
    after = decoder.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(not block._forward_pre_hooks for block in decoder.blocks)


def _grads(decoder: Decoder, tokens: torch.Tensor, drop: DropPlan | None) -> dict[str, torch.Tensor]:
    decoder.zero_grad(set_to_none=False)
    decoder(tokens, plan=drop).float().pow(2).mean().backward()
    return {name: p.grad.clone() for name, p in decoder.named_parameters()}


def _exit_loss_grads(decoder: Decoder, tokens: torch.Tensor, drop: DropPlan | None) -> dict[str, torch.Tensor]:
    """Gradients of the early-exit objective at every exit, final layer included
    (framework/module.py's route: the stream after each block, the shared head)."""
    from framework.loss import exit_cross_entropies

    decoder.zero_grad(set_to_none=False)
    states = decoder.hidden(tokens, plan=drop, all_layers=True)  # the same shapes as _grads: no new graph
    targets = tokens.roll(-1, dims=1)
    per_exit = exit_cross_entropies(states, targets, decoder.logits, range(1, len(states) + 1), chunk_tokens=16)
    sum(exit * loss for exit, loss in per_exit.items()).backward()
    return {name: p.grad.clone() for name, p in decoder.named_parameters()}


def test_activation_checkpointing_keeps_names_and_gradients_under_layer_dropout():
    reference = tiny_decoder()
    checkpointed = parallelize(copy.deepcopy(reference), activation_checkpointing=True)
    assert [n for n, _ in checkpointed.named_parameters()] == [n for n, _ in reference.named_parameters()]
    assert checkpointed.state_dict().keys() == reference.state_dict().keys()
    for p in reference.parameters():
        p.grad = torch.zeros_like(p)
    for p in checkpointed.parameters():
        p.grad = torch.zeros_like(p)
    tokens = torch.randint(0, 128, (4, 16))
    cfg = LayerDropoutConfig(p_max=0.7, distribution="uniform", schedule="constant")
    plans = [plan(cfg, [0.7] * 4, 4, StepKey(0, 0, step)) for step in range(4)]
    # The draws include a layer that keeps no row at all (the zero-row call).
    plans.append(DropPlan.from_masks([torch.tensor([True, False, True, False]), torch.zeros(4, dtype=torch.bool),
                                      torch.ones(4, dtype=torch.bool), torch.tensor([False, False, False, True])],
                                     [2.0, 4.0, 1.0, 4.0]))
    for drop in plans + [None]:
        expected, got = _grads(reference, tokens, drop), _grads(checkpointed, tokens, drop)
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_activation_checkpointing_recomputes_in_backward():
    """The checkpointed block runs its layers twice per step (forward + recompute).
    (The recompute stops once the last saved tensor is back, so hook an inner layer.)"""
    decoder = parallelize(tiny_decoder(), activation_checkpointing=True)
    calls = []
    decoder.blocks[1].ffn.up.register_forward_hook(lambda *_: calls.append(1))
    decoder(torch.randint(0, 128, (2, 8))).sum().backward()
    assert len(calls) == 2


def test_full_parameters_is_a_no_op_without_zero3_partitioning():
    decoder = tiny_decoder()
    with full_parameters(decoder), torch.no_grad():
        decoder.head.weight.fill_(0.5)
    assert torch.all(decoder.head.weight == 0.5)  # (ZeRO-3 itself: tests/distributed)


def test_mesh_without_a_data_parallel_dim_is_refused():
    class FakeMesh:
        mesh_dim_names = ("pipeline", "tensor")
        ndim = 2

    with pytest.raises(ValueError, match=r"device_mesh has dims \('pipeline', 'tensor'\); expected \('replicate', 'shard'\)"):
        parallelize(tiny_decoder(), device_mesh=FakeMesh())


def test_a_policy_without_a_mesh_is_refused():
    with pytest.raises(ValueError, match="mp_policy is FSDP2's: it needs a device_mesh"):
        parallelize(tiny_decoder(), mp_policy=mixed_precision_policy("bfloat16"))


# --------------------------------------------------------- FSDP2 mixed precision


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
    """framework/lightning_internals.py reaches into these; a Lightning upgrade that
    renames one must fail here, not inside a multi-process run."""
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import ModelParallelStrategy

    assert callable(getattr(ModelParallelStrategy, "_setup_distributed", None))
    assert "_device_mesh" in vars(ModelParallelStrategy())
    assert "_device_mesh" in vars(pl.LightningModule())


# ------------------------------------------------------------------ compile


@pytest.mark.slow
def test_compiled_blocks_match_eager_and_stop_compiling_once_warm():
    """ILD + DTS: kept-row counts (zero included) and r_train = 1/ρ change every step.
    After the first step nothing recompiles (a recompilation per step would soon hit
    torch._dynamo's recompile_limit and leave the blocks silently eager), and the
    gradients are eager's, of the plain forward and of the early-exit loss (the stream
    after every block through the shared final norm and head, as the training step
    computes it). (How many graphs the first step makes depends on the
    attention kernel: CPU's SDPA splits the block at a graph break;
    benchmarks/gpu_check.sh counts them with FlexAttention on a GPU.)"""
    from torch._dynamo.utils import counters

    from framework.schedules import dropout_rates

    torch._dynamo.reset()
    counters.clear()
    reference = tiny_decoder()
    compiled = parallelize(copy.deepcopy(reference), compile=True)
    cfg = LayerDropoutConfig(p_max=0.8, distribution="increasing", schedule="decreasing")
    steps, graphs, kept = 10, [], set()
    for step in range(steps):
        drop = plan(cfg, dropout_rates(cfg, 4, step, steps), 4, StepKey(0, 0, step))
        kept.update(drop.kept_counts())
        tokens = torch.randint(0, 128, (4, 16), generator=torch.Generator().manual_seed(step))
        for grads in (_grads, _exit_loss_grads):
            expected, got = grads(reference, tokens, drop), grads(compiled, tokens, drop)
            for name in expected:
                torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-5,
                                           msg=f"{grads.__name__}: {name}")
        graphs.append(counters["stats"]["unique_graphs"])
    assert len({rows for rows, _ in kept}) >= 3 and (0, 0) in kept  # the row counts did change
    assert graphs[1:] == [graphs[0]] * (steps - 1), graphs  # every graph made in step 0, none later
    assert not any("recompile" in key.lower() for key in counters["unimplemented"])
