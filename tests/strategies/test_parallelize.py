"""framework/strategies/parallelize.py in one process: ``parallelize`` without a mesh,
activation checkpointing (names and gradients kept under layer dropout), its refusals,
and compiled blocks against eager. With a mesh, on 2 ranks: tests/distributed/."""

from __future__ import annotations

import copy

import pytest
import torch

from framework.config import LayerDropoutConfig, ModelConfig
from framework.layer_dropout import DropPlan, StepKey, plan
from framework.model.decoder import Decoder
from framework.strategies import mixed_precision_policy, parallelize


def tiny_decoder() -> Decoder:
    torch.manual_seed(0)
    return Decoder(ModelConfig(vocab_size=128, d_model=32, n_layers=4, n_heads=4, max_seq_len=32, attention="sdpa"))


def test_parallelize_needs_blocks():
    with pytest.raises(ValueError, match="needs a Decoder with a `blocks` ModuleList; got Linear"):
        parallelize(torch.nn.Linear(2, 2), activation_checkpointing=True)




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
    (framework/training/module.py's route: the stream after each block, the shared head)."""
    from framework.model.loss import exit_cross_entropies

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


def test_mesh_without_a_data_parallel_dim_is_refused():
    class FakeMesh:
        mesh_dim_names = ("pipeline", "tensor")
        ndim = 2

    with pytest.raises(ValueError, match=r"device_mesh has dims \('pipeline', 'tensor'\); expected \('replicate', 'shard'\)"):
        parallelize(tiny_decoder(), device_mesh=FakeMesh())


def test_a_policy_without_a_mesh_is_refused():
    with pytest.raises(ValueError, match="mp_policy is FSDP2's: it needs a device_mesh"):
        parallelize(tiny_decoder(), mp_policy=mixed_precision_policy("bfloat16"))


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
