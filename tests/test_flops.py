import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import framework.model.decoder
from framework.config import LayerDropoutConfig, ModelConfig
from framework.flops import (
    Flops,
    block_flops_per_token,
    dense_step_flops,
    executed_step_flops,
    expected_executed_fraction,
    head_flops_per_token,
    saved_fraction,
)
from framework.layer_dropout import DropPlan, plan
from framework.model.decoder import Decoder
from framework.schedules import dropout_rates, mean_dropout

CFG = ModelConfig(vocab_size=96, d_model=32, n_layers=3, n_heads=2, head_dim=24, max_seq_len=16)
SEQ = 10


def test_per_token_counts_by_hand():
    # d=32, a=2·24=48, f=8·32=256, V=96, S=10.
    linear_attention = 2 * 32 * 3 * 48 + 2 * 48 * 32
    causal = block_flops_per_token(CFG, SEQ, training=False)
    assert causal.attention == linear_attention + 4 * 48 * 5.5  # (S+1)/2 keys on average
    assert causal.ffn == 4 * 32 * 256
    full = block_flops_per_token(CFG, SEQ, causal=False, training=False)
    assert full.attention == linear_attention + 4 * 48 * 10
    training = block_flops_per_token(CFG, SEQ)
    assert (training.attention, training.ffn) == (3 * causal.attention, 3 * causal.ffn)
    assert head_flops_per_token(CFG, training=False) == 2 * 32 * 96
    assert head_flops_per_token(CFG) == 6 * 32 * 96


def test_dense_step_scales_per_token_counts():
    dense = dense_step_flops(CFG, 4, SEQ)
    per_token = block_flops_per_token(CFG, SEQ)
    tokens = 4 * SEQ
    assert dense.attention == CFG.n_layers * tokens * per_token.attention
    assert dense.ffn == CFG.n_layers * tokens * per_token.ffn
    assert dense.head == tokens * head_flops_per_token(CFG)
    assert dense.total == dense.blocks + dense.head


def naive_sdpa(q, k, v, bias):
    """Attention as plain matmuls, so FlopCounterMode sees the score FLOPs (on CPU it does
    not count the fused SDPA kernel)."""
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1]) + bias
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def counted_flops(model, tokens, drop_plan=None, backward=True):
    with FlopCounterMode(display=False) as counter:
        logits = model(tokens, plan=drop_plan)
        if backward:
            logits.sum().backward()
    return counter.get_total_flops()


@pytest.fixture
def decoder(monkeypatch):
    monkeypatch.setattr(framework.model.decoder, "sdpa_attention", naive_sdpa)
    torch.manual_seed(0)
    return Decoder(CFG)


def test_dense_count_equals_torch_flop_counter(decoder):
    tokens = torch.randint(0, 96, (4, SEQ))
    # torch's counter runs every query against every key: the causal=False convention.
    assert counted_flops(decoder, tokens, backward=False) == \
        dense_step_flops(CFG, 4, SEQ, causal=False, training=False).total
    assert counted_flops(decoder, tokens) == dense_step_flops(CFG, 4, SEQ, causal=False).total


def test_executed_count_of_a_plan_equals_torch_flop_counter(decoder):
    attn = [torch.tensor([1, 0, 1, 1]), torch.zeros(4), torch.tensor([0, 0, 1, 0])]
    ffn = [torch.tensor([1, 1, 1, 1]), torch.tensor([0, 1, 0, 0]), torch.zeros(4)]
    drop_plan = DropPlan.from_masks([m.bool() for m in attn], [1.0, 1.0, 1.0],
                                    ffn_masks=[m.bool() for m in ffn])
    assert drop_plan.kept_counts() == [(3, 4), (0, 1), (1, 0)]
    executed = executed_step_flops(CFG, drop_plan.kept_counts(), SEQ, batch_size=4, causal=False)
    assert counted_flops(decoder, torch.randint(0, 96, (4, SEQ)), drop_plan) == executed.total


def test_block_matmuls_follow_the_6n_rule_at_paper_size():
    cfg = ModelConfig.paper("271M")
    with torch.device("meta"):
        model = Decoder(cfg)
    block_weights = sum(p.numel() for name, p in model.named_parameters()
                        if name.startswith("blocks.") and name.endswith("weight") and p.dim() == 2)
    per_token = block_flops_per_token(cfg, 1, causal=False)  # one key: scores are 2·2·a·1
    scores = 3 * 4 * cfg.attn_dim * cfg.n_layers
    assert cfg.n_layers * per_token.blocks - scores == 6 * block_weights
    assert head_flops_per_token(cfg) == 6 * model.head.weight.numel()


def test_executed_count_sums_the_rows_each_sublayer_ran():
    executed = executed_step_flops(CFG, [(3, 2), (3, 0), (4, 4)], SEQ, batch_size=4)
    per_token = block_flops_per_token(CFG, SEQ)
    assert executed.attention == (3 + 3 + 4) * SEQ * per_token.attention
    assert executed.ffn == (2 + 0 + 4) * SEQ * per_token.ffn
    assert executed.head == 4 * SEQ * head_flops_per_token(CFG)


def test_saved_fraction_over_blocks_and_over_the_step():
    dense = dense_step_flops(CFG, 4, SEQ)
    executed = executed_step_flops(CFG, [(4, 4), (2, 2), (0, 0)], SEQ, batch_size=4)
    assert saved_fraction(executed, dense) == pytest.approx(0.5)
    assert saved_fraction(executed, dense, include_head=True) == pytest.approx(
        0.5 * dense.blocks / dense.total)
    assert saved_fraction(dense, dense) == 0.0


def test_saved_fraction_of_whole_layers_does_not_depend_on_the_attention_convention():
    kept = [(4, 4), (1, 1), (0, 0)]  # "layer" structure: both sublayers keep the same rows
    fractions = [saved_fraction(executed_step_flops(CFG, kept, SEQ, batch_size=4, causal=causal),
                                dense_step_flops(CFG, 4, SEQ, causal=causal))
                 for causal in (True, False)]
    assert fractions[0] == pytest.approx(fractions[1])


def test_expected_executed_fraction():
    assert expected_executed_fraction([0.0, 0.2, 0.4]) == pytest.approx(0.8)
    assert expected_executed_fraction([0.0]) == 1.0


# --- sampled plans: executed / dense ≈ 1 - P̄ -----------------------------------------

LAYERS, BATCH, STEPS = 8, 16, 300
SCHEDULE = LayerDropoutConfig(p_max=0.5, distribution="increasing", schedule="decreasing")


def run_fraction(draw_kept, layer_cfg=SCHEDULE):
    """Average executed/dense block FLOPs over a run whose step t drops at the schedule's
    rates; ``draw_kept(rates, step)`` returns the kept counts of that step."""
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=LAYERS, n_heads=2, max_seq_len=16)
    dense = dense_step_flops(cfg, BATCH, SEQ)
    total = 0.0
    for step in range(STEPS):
        rates = dropout_rates(layer_cfg, LAYERS, step, STEPS)
        total += 1 - saved_fraction(executed_step_flops(cfg, draw_kept(rates, step), SEQ,
                                                        batch_size=BATCH), dense)
    return total / STEPS


def tolerance(unit_draws_per_layer_step):
    """4 standard errors of the run average: each of the L·T layer-steps runs a
    fraction of rows that is a mean of ``n`` Bernoulli(1-p) draws."""
    variance = sum(p * (1 - p) for step in range(STEPS)
                   for p in dropout_rates(SCHEDULE, LAYERS, step, STEPS))
    return 4 * math.sqrt(variance / unit_draws_per_layer_step) / (LAYERS * STEPS)


def test_sampled_bernoulli_counts_save_mean_dropout():
    gen = torch.Generator().manual_seed(0)

    def draw(rates, step):
        keep = torch.bernoulli(1 - torch.tensor(rates)[:, None].expand(LAYERS, BATCH), generator=gen)
        counts = keep.sum(dim=1).long().tolist()
        return [(c, c) for c in counts]

    expected = 1 - mean_dropout(SCHEDULE, LAYERS, STEPS)
    assert expected == pytest.approx(1 - 0.125)
    assert run_fraction(draw) == pytest.approx(expected, abs=tolerance(BATCH))


@pytest.mark.parametrize("mask, structure, draws", [
    ("sequence", "layer", BATCH), ("sequence", "sublayer", 2 * BATCH), ("batch", "layer", 1),
    ("count", "layer", BATCH)])  # a rounded count varies less than B Bernoulli draws
def test_real_plans_save_mean_dropout(mask, structure, draws):
    layer_cfg = LayerDropoutConfig(p_max=0.5, distribution="increasing", schedule="decreasing",
                                   mask=mask, structure=structure)
    gen = torch.Generator().manual_seed(1)
    fraction = run_fraction(lambda rates, step: plan(layer_cfg, rates, BATCH, gen).kept_counts(), layer_cfg)
    # Sublayer masks are independent draws for attention and FFN, which both weigh in.
    assert fraction == pytest.approx(1 - mean_dropout(layer_cfg, LAYERS, STEPS),
                                     abs=tolerance(draws))


def test_exit_heads_of_the_early_exit_loss_equal_torch_flop_counter(decoder):
    """Each exit of the early-exit loss is one more head, forward and backward, on every token."""
    from framework.model.loss import chunked_cross_entropy, exit_cross_entropies

    tokens, targets = torch.randint(0, 96, (2, 4, SEQ))
    keep = [torch.tensor([1, 0, 1, 1]).bool(), torch.ones(4).bool(), torch.tensor([0, 0, 1, 0]).bool()]
    drop_plan = DropPlan.from_masks(keep, [1.0, 1.0, 1.0])
    with FlopCounterMode(display=False) as counter:
        states = decoder.hidden(tokens, plan=drop_plan, all_layers=True)
        loss = chunked_cross_entropy(states[-1], targets, decoder.logits)
        exits = exit_cross_entropies(states, targets, decoder.logits, [1, 2])
        (loss + exits[1] + exits[2]).backward()
    executed = executed_step_flops(CFG, drop_plan.kept_counts(), SEQ, batch_size=4, causal=False, exit_heads=2)
    assert counter.get_total_flops() == executed.total
    assert executed.head == 3 * executed_step_flops(CFG, drop_plan.kept_counts(), SEQ, batch_size=4).head
    assert dense_step_flops(CFG, 4, SEQ, exit_heads=2).head == executed.head
