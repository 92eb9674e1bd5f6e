"""Layer dropout: gather/scatter equals the mask-multiply definition; masks are drawn right."""

from __future__ import annotations

import math

import pytest
import torch

from framework.config import LayerDropoutConfig, ModelConfig
from framework.layer_dropout import DropPlan, LayerDrop, StepKey, plan
from framework.model.decoder import Block, Decoder
from framework.schedules import dropout_rates, mean_dropout
from tests.helpers.reference_decoder import reference_logits

VOCAB, BATCH, SEQ = 61, 5, 7


def make_decoder(n_layers=4, **overrides) -> Decoder:
    torch.manual_seed(0)
    cfg = ModelConfig(**{"vocab_size": VOCAB, "d_model": 32, "n_layers": n_layers, "n_heads": 4,
                         "max_seq_len": 16, **overrides})
    return Decoder(cfg).train()


def logits_and_grads(decoder, run):
    decoder.zero_grad(set_to_none=True)
    logits = run()
    weights = torch.linspace(-1, 1, logits.numel()).view_as(logits)  # a loss touching every logit
    (logits * weights).sum().backward()
    return logits.detach(), {name: p.grad.clone() for name, p in decoder.named_parameters()}


def assert_same_forward_and_grads(decoder, tokens, attn_masks, ffn_masks, scales):
    drop_plan = DropPlan.from_masks(attn_masks, scales, ffn_masks)
    fast, fast_grads = logits_and_grads(decoder, lambda: decoder(tokens, plan=drop_plan))
    slow, slow_grads = logits_and_grads(
        decoder, lambda: reference_logits(decoder, tokens, attn_masks, ffn_masks, scales))
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    assert fast_grads.keys() == slow_grads.keys()
    for name, expected in slow_grads.items():
        # A gradient entry sums B·S·V float32 terms that partly cancel: the tolerance is
        # 1e-5 relative to the tensor's largest entry, not to each (possibly tiny) entry.
        atol = 1e-5 * max(1.0, expected.abs().max().item())
        torch.testing.assert_close(fast_grads[name], expected, rtol=1e-5, atol=atol, msg=name)


def masks(*rows: str) -> list[torch.Tensor]:
    return [torch.tensor([c == "1" for c in r]) for r in rows]


@pytest.mark.parametrize("residual_multiplier, logit_multiplier, dtype", [
    (1.0, 1.0, torch.float32), (0.5, 0.25, torch.float32), (1.0, 1.0, torch.float64)])
def test_layer_structure_matches_reference(residual_multiplier, logit_multiplier, dtype):
    decoder = make_decoder(residual_multiplier=residual_multiplier, logit_multiplier=logit_multiplier).to(dtype)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    keep = masks("11111", "10110", "00000", "01000")  # all, some, none, one row
    scales = [1.0, 1 / 0.6, 1 / 0.3, 1 / 0.2]
    assert_same_forward_and_grads(decoder, tokens, keep, keep, scales)


def test_sublayer_structure_matches_reference():
    decoder = make_decoder(residual_multiplier=0.5, logit_multiplier=0.5)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    attn = masks("10101", "11111", "00000", "01110")
    ffn = masks("01011", "00000", "11100", "01110")
    assert_same_forward_and_grads(decoder, tokens, attn, ffn, [1.25, 2.0, 1.0, 1.6])


def test_dropped_rows_are_untouched_and_zero_kept_is_identity():
    decoder = make_decoder()
    block = decoder.blocks[0]
    h = torch.randn(BATCH, SEQ, 32)
    bias = decoder.attention_bias(SEQ, None)
    rows = torch.tensor([0, 3])
    out = block(h, bias, LayerDrop(rows, rows, 1.7))
    dropped = [1, 2, 4]
    assert torch.equal(out[dropped], h[dropped])
    assert not torch.allclose(out[rows], h[rows])
    empty = torch.zeros(0, dtype=torch.long)
    assert torch.equal(block(h, bias, LayerDrop(empty, empty, 3.0)), h)


def test_every_block_is_called_and_gets_zero_grads_when_nothing_is_kept():
    decoder = make_decoder()
    calls = {name: 0 for name in ("block", "attn", "ffn")}
    for block in decoder.blocks:
        assert isinstance(block, Block)
        block.register_forward_hook(lambda *_: calls.__setitem__("block", calls["block"] + 1))
        block.attn.register_forward_hook(lambda *_: calls.__setitem__("attn", calls["attn"] + 1))
        block.ffn.register_forward_hook(lambda *_: calls.__setitem__("ffn", calls["ffn"] + 1))
    none = torch.zeros(BATCH, dtype=torch.bool)
    drop_plan = DropPlan.from_masks([none] * 4, [1.0] * 4)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    logits = decoder(tokens, plan=drop_plan)
    assert calls == {"block": 4, "attn": 4, "ffn": 4}  # SPMD: every rank calls every block
    torch.testing.assert_close(logits, decoder.logits(decoder.embed(tokens)))
    logits.sum().backward()
    for name, p in decoder.blocks.named_parameters():
        assert p.grad is not None and torch.count_nonzero(p.grad) == 0, name  # in the graph, zero


def mask_of(rows: torch.Tensor | None, batch_size: int) -> torch.Tensor:
    mask = torch.ones(batch_size, dtype=torch.bool)
    if rows is not None:
        mask = torch.zeros(batch_size, dtype=torch.bool)
        mask[rows] = True
    return mask


def draw_masks(cfg, rates, batch_size, draws, seed=0):
    """[draws, layers, batch] keep masks for attention and FFN, and the scales per layer."""
    gen = torch.Generator().manual_seed(seed)
    attn, ffn, scales = [], [], set()
    for _ in range(draws):
        drop_plan = plan(cfg, rates, batch_size, gen)
        attn.append(torch.stack([mask_of(layer.attn_rows, batch_size) for layer in drop_plan.layers]))
        ffn.append(torch.stack([mask_of(layer.ffn_rows, batch_size) for layer in drop_plan.layers]))
        scales.add(tuple(layer.scale for layer in drop_plan.layers))
    assert len(scales) == 1  # the scale depends on the rate, not on the draw
    return torch.stack(attn).float(), torch.stack(ffn).float(), list(scales.pop())


RATES = [0.0, 0.1, 0.3, 0.5, 0.75]


@pytest.mark.parametrize("structure", ["layer", "sublayer"])
def test_sequence_mask_keep_frequency(structure):
    cfg = LayerDropoutConfig(p_max=0.5, mask="sequence", structure=structure)
    draws, batch = 600, 8
    attn, ffn, scales = draw_masks(cfg, RATES, batch, draws)
    for which in (attn, ffn):
        for layer, p in enumerate(RATES):
            keep = 1.0 - p
            sigma = math.sqrt(p * (1 - p) / (draws * batch))
            assert abs(which[:, layer].mean().item() - keep) <= 3 * sigma + 1e-12, (layer, p)
    assert scales == pytest.approx([1 / (1 - p) for p in RATES])
    if structure == "layer":
        assert torch.equal(attn, ffn)
    else:
        assert not torch.equal(attn[:, 1:], ffn[:, 1:])  # independent draws


@pytest.mark.parametrize("structure", ["layer", "sublayer"])
def test_batch_mask_keeps_all_or_nothing_at_one_minus_p(structure):
    cfg = LayerDropoutConfig(p_max=0.5, mask="batch", structure=structure)
    draws, batch = 2000, 6
    attn, ffn, scales = draw_masks(cfg, RATES, batch, draws)
    for which in (attn, ffn):
        per_draw = which.mean(dim=2)  # [draws, layers]: one draw per layer per micro-batch
        assert torch.all((per_draw == 0) | (per_draw == 1))
        for layer, p in enumerate(RATES):
            sigma = math.sqrt(p * (1 - p) / draws)
            assert abs(per_draw[:, layer].mean().item() - (1 - p)) <= 3 * sigma + 1e-12, (layer, p)
    assert scales == pytest.approx([1 / (1 - p) for p in RATES])


@pytest.mark.parametrize("structure", ["layer", "sublayer"])
def test_count_mask_keeps_one_of_the_two_nearest_counts_at_rate_p(structure):
    rates = RATES + [0.95]
    cfg = LayerDropoutConfig(mask="count", structure=structure)
    draws, batch = 1500, 6
    attn, ffn, scales = draw_masks(cfg, rates, batch, draws)
    assert scales == pytest.approx([1 / (1 - p) for p in rates])  # 1/ρ, as every mode
    for layer, p in enumerate(rates):
        expected = batch * (1 - p)
        for which in (attn, ffn):
            counts = which[:, layer].sum(dim=1)
            # At most two shapes per layer: the two integers around B·(1 - p).
            assert set(counts.tolist()) <= {math.floor(expected), math.ceil(expected)}, (layer, p)
            # E[k] = B·(1 - p): stochastic rounding, 3σ of the mean of `draws` roundings.
            frac = expected - math.floor(expected)
            sigma = math.sqrt(frac * (1 - frac) / draws)
            assert abs(counts.float().mean().item() - expected) <= 3 * sigma + 1e-9, (layer, p)
            # Every row equally likely: per-row frequency 1 - p (4σ: B rows tested at once).
            row_sigma = math.sqrt(p * (1 - p) / draws)
            assert torch.all((which[:, layer].mean(dim=0) - (1 - p)).abs() <= 4 * row_sigma + 1e-12), (layer, p)


@pytest.mark.parametrize("batch", [4, 8, 64])
def test_count_mode_drops_the_mean_dropout_over_a_run(batch):
    """ILD + DTS over a run: the fraction of rows dropped is P̄ within 3σ, where the old
    round(B·(1 - p)) dropped 0.083 instead of 0.100 at B = 4."""
    layers, steps = 13, 300
    cfg = LayerDropoutConfig(p_max=0.4, mask="count")
    dropped = variance = 0.0
    for step in range(steps):
        rates = dropout_rates(cfg, layers, step, steps)
        drop_plan = plan(cfg, rates, batch, StepKey(0, 0, step))
        dropped += sum(batch - kept for kept, _ in drop_plan.kept_counts())
        for p in rates:  # Var(k) = frac·(1 - frac) for a stochastically rounded count
            frac = batch * (1 - p) - math.floor(batch * (1 - p))
            variance += frac * (1 - frac)
    rows = batch * layers * steps
    p_bar = mean_dropout(cfg, layers, steps)
    assert p_bar == pytest.approx(0.1)
    assert abs(dropped / rows - p_bar) <= 3 * math.sqrt(variance) / rows


def test_count_mode_is_unbiased_where_b_times_p_is_below_one():
    """p < 1/(2B): the old rounding never dropped; stochastic rounding drops at rate p."""
    cfg = LayerDropoutConfig(mask="count")
    p, batch, draws = 0.05, 8, 4000
    attn, _, scales = draw_masks(cfg, [p], batch, draws)
    sigma = math.sqrt(p * (1 - p) / (draws * batch))
    assert abs((1 - attn.mean().item()) - p) <= 3 * sigma
    assert abs((attn * scales[0]).mean().item() - 1.0) <= 3 * scales[0] * sigma  # E[scale·M] = 1


def test_zero_rate_layers_run_dense():
    drop_plan = plan(LayerDropoutConfig(mask="sequence"), [0.0, 0.5, 0.0], 4, StepKey(0, 0, 0))
    for index in (0, 2):
        layer = drop_plan.layers[index]
        assert layer.attn_rows is None and layer.ffn_rows is None and layer.scale == 1.0
    assert drop_plan.kept_counts()[0] == (4, 4)


def plan_masks(key: StepKey, cfg=None, rates=(0.5,) * 4, batch=32) -> torch.Tensor:
    cfg = cfg or LayerDropoutConfig(mask="sequence", structure="sublayer")
    drop_plan = plan(cfg, list(rates), batch, key)
    return torch.stack([torch.stack([mask_of(layer.attn_rows, batch), mask_of(layer.ffn_rows, batch)])
                        for layer in drop_plan.layers])


def test_step_key_reproduces_masks_and_differs_across_devices_steps_micro_batches():
    key = StepKey(seed=7, rank=1, step=100, micro_batch=2)
    first = plan_masks(key)
    torch.manual_seed(123)
    torch.rand(10)  # the global RNG must not matter (resume needs no RNG state)
    assert torch.equal(plan_masks(StepKey(7, 1, 100, 2)), first)
    for other in (StepKey(7, 0, 100, 2), StepKey(7, 1, 101, 2), StepKey(7, 1, 100, 3), StepKey(8, 1, 100, 2)):
        assert not torch.equal(plan_masks(other), first), other
    assert not torch.equal(first[0], first[1])  # each layer has its own stream


def test_from_masks_checks_shapes():
    with pytest.raises(ValueError, match="one entry per layer"):
        DropPlan.from_masks(masks("11", "10"), [1.0])
    with pytest.raises(ValueError, match="masks of layer 1 are invalid"):
        DropPlan.from_masks(masks("11", "101"), [1.0, 1.0])
    with pytest.raises(ValueError, match="scales\\[0\\]=0.0 is invalid"):
        DropPlan.from_masks(masks("11"), [0.0])


def test_from_masks_rows_and_kept_counts():
    drop_plan = DropPlan.from_masks(masks("1011", "0000"), [1.5, 2.0], masks("0011", "1111"))
    assert drop_plan.batch_size == 4 and len(drop_plan) == 2
    assert drop_plan.layers[0].attn_rows.tolist() == [0, 2, 3]
    assert drop_plan.layers[0].ffn_rows.tolist() == [2, 3]
    assert drop_plan.kept_counts() == [(3, 2), (0, 4)]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_zero_kept_rows_keep_every_parameter_in_the_graph_with_flex_attention():
    # FlexAttention has no CPU backward, but with zero kept rows it is never launched,
    # so the zero-row path's graph can be checked here.
    decoder = make_decoder(attention="flex")
    none = torch.zeros(BATCH, dtype=torch.bool)
    decoder(torch.randint(0, VOCAB, (BATCH, SEQ)), plan=DropPlan.from_masks([none] * 4, [2.0] * 4)).sum().backward()
    for name, p in decoder.blocks.named_parameters():
        assert p.grad is not None and torch.count_nonzero(p.grad) == 0, name


def test_bf16_autocast_keeps_a_float32_residual_stream_with_a_plan():
    """Under bf16-mixed (autocast) a branch returns bf16 while the residual stream stays float32:
    the scatter-add casts the branch (found on the first H200 run: `index_add_(): self (Float) and
    source (BFloat16) must have the same scalar type` in every dropout run, single device)."""
    decoder = make_decoder()
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    keep = masks("11111", "10110", "00000", "01000")
    drop_plan = DropPlan.from_masks(keep, [1.0, 1 / 0.6, 1 / 0.3, 1 / 0.2], keep)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = decoder(tokens, plan=drop_plan)
    mixed.float().sum().backward()
    full = decoder(tokens, plan=drop_plan).detach()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in decoder.parameters())
    torch.testing.assert_close(mixed.float(), full, rtol=0.05, atol=0.05)  # bf16's 8 bits of mantissa
