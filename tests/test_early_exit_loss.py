"""The early-exit loss: its weights and curricula by step, the loss against a slow
reference (a loop over exits with the plain head), its logging, and exact resume in the
middle of a curriculum."""

from __future__ import annotations

import json
import math

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F

from framework.config import EarlyExitLossConfig, LayerDropoutConfig
from framework.early_exit_loss import active_exits, configured_exits, exit_weights, mean_exit_heads
from framework.layer_dropout import DropPlan
from framework.training.pretrain import main
from tests.helpers.reference_decoder import layer_norm, reference_hidden
from tests.helpers.step_records import records
from tests.helpers.tiny_training import KeepingLogger, RandomTokens, SimulatedCrash, quiet_trainer, tiny_cli_args, tiny_module

L = 8  # exits 1..7


def exits_by_step(cfg, steps=8, layers=L):
    return [active_exits(cfg, layers, t, steps) for t in range(steps)]


# ------------------------------------------------------------------ exits and weights


def test_configured_exits_all_every_and_list():
    assert configured_exits(EarlyExitLossConfig(scale=1.0), L) == [1, 2, 3, 4, 5, 6, 7]
    assert configured_exits(EarlyExitLossConfig(scale=1.0, every=3), L) == [3, 6]
    assert configured_exits(EarlyExitLossConfig(scale=1.0, exits=(5, 2)), L) == [2, 5]
    assert configured_exits(EarlyExitLossConfig(), L) == []  # scale 0: off


def test_no_curriculum_trains_every_exit_every_step():
    assert exits_by_step(EarlyExitLossConfig(scale=1.0, every=2)) == [[2, 4, 6]] * 8


def test_rotational_curriculum_rotates_through_the_exits():
    cfg = EarlyExitLossConfig(scale=1.0, curriculum="rotational", rotation=3)
    assert exits_by_step(cfg, steps=6) == [[1, 4, 7], [2, 5], [3, 6], [1, 4, 7], [2, 5], [3, 6]]
    listed = EarlyExitLossConfig(scale=1.0, exits=(2, 3, 6), curriculum="rotational")
    assert exits_by_step(listed, steps=4) == [[2, 6], [3], [2, 6], [3]]


def test_gradual_curriculum_switches_exits_on_from_the_top_down():
    cfg = EarlyExitLossConfig(scale=1.0, every=2, curriculum="gradual")  # exits 2, 4, 6 over T = 9 steps
    assert exits_by_step(cfg, steps=9) == [[6]] * 3 + [[4, 6]] * 3 + [[2, 4, 6]] * 3
    half = EarlyExitLossConfig(scale=1.0, every=2, curriculum="gradual", ramp=0.5)  # over the first 6 of 12
    assert exits_by_step(half, steps=12) == [[6]] * 2 + [[4, 6]] * 2 + [[2, 4, 6]] * 8


@pytest.mark.parametrize("weighting, scales", [
    ("uniform", [1, 1, 1]), ("linear", [2, 4, 6]), ("sum", [3, 10, 21]),
    ("sqrt", [math.sqrt(2), 2, math.sqrt(6)]), ("inverse", [1 / 2, 1 / 4, 1 / 6])])
def test_weights_are_the_scale_function_normalised_to_the_scale(weighting, scales):
    cfg = EarlyExitLossConfig(scale=0.6, every=2, weighting=weighting)
    weights = exit_weights(cfg, L, 0, 10)
    assert list(weights) == [2, 4, 6]
    assert list(weights.values()) == pytest.approx([0.6 * s / sum(scales) for s in scales])


def test_weights_are_renormalised_over_the_step_s_exits():
    cfg = EarlyExitLossConfig(scale=2.0, weighting="linear", curriculum="rotational")
    assert exit_weights(cfg, 4, 0, 10) == pytest.approx({1: 2.0 * 1 / 4, 3: 2.0 * 3 / 4})
    assert exit_weights(cfg, 4, 1, 10) == pytest.approx({2: 2.0})
    assert exit_weights(EarlyExitLossConfig(), 4, 0, 10) == {}


def test_mean_exit_heads_sums_the_curriculum():
    assert mean_exit_heads(EarlyExitLossConfig(scale=1.0, every=2), L, 9) == 3
    assert mean_exit_heads(EarlyExitLossConfig(scale=1.0, every=2, curriculum="gradual"), L, 9) == 2
    assert mean_exit_heads(EarlyExitLossConfig(scale=1.0, curriculum="rotational", rotation=3), L, 6) == 7 / 3
    assert mean_exit_heads(EarlyExitLossConfig(), L, 9) == 0


@pytest.mark.parametrize("kwargs, field", [
    (dict(scale=1.0, exits=(3, 8)), "exits"), (dict(scale=1.0, every=8), "every"),
    (dict(scale=1.0, every=4, curriculum="rotational", rotation=3), "rotation")])
def test_exits_the_model_lacks_are_refused_when_the_module_is_built(kwargs, field):
    with pytest.raises(ValueError, match=rf"^early_exit_loss\.{field}=.* is invalid: "):
        tiny_module(layers=L, early_exit_loss=EarlyExitLossConfig(**kwargs))


# ------------------------------------------------------------ the loss vs a slow reference


def plain_exit_loss(model, h, targets):
    """Cross-entropy of the shared final norm and head, on all logits at once."""
    params = dict(model.named_parameters())
    x = layer_norm(h, params["norm.weight"], params["norm.bias"], model.config.norm_eps)
    logits = (x @ params["head.weight"].T) * model.config.logit_multiplier
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def reference_objective(model, tokens, targets, masks, scales, weights):
    final = plain_exit_loss(model, reference_hidden(model, tokens, masks, scales=scales), targets)
    for exit, weight in weights.items():  # each exit's forward from scratch: blocks 0..K-1
        final = final + weight * plain_exit_loss(
            model, reference_hidden(model, tokens, masks, scales=scales, layers=exit), targets)
    return final


@pytest.mark.parametrize("weighting", ["uniform", "sum", "inverse"])
def test_loss_and_gradients_equal_the_reference_loop_over_exits(weighting):
    torch.manual_seed(0)
    module = tiny_module(layers=4, loss_chunk_tokens=7,  # several chunks per exit
                         early_exit_loss=EarlyExitLossConfig(scale=0.8, weighting=weighting))
    module.configure_model()
    model = module.model
    tokens, targets = torch.randint(0, 64, (2, 4, 16))
    masks = [torch.tensor(m, dtype=torch.bool) for m in ([1, 1, 1, 1], [1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 1, 1])]
    scales = [1.0, 2.0, 1.0, 4 / 3]
    drop = DropPlan.from_masks(masks, scales)
    weights = exit_weights(module.exit_cfg, 4, 0, 10)
    assert list(weights) == [1, 2, 3]

    objective, final, per_exit = module.losses(tokens, targets, drop, weights)
    reference = reference_objective(model, tokens, targets, masks, scales, weights)
    assert objective.item() == pytest.approx(reference.item(), abs=1e-5)
    assert final.item() == pytest.approx(plain_exit_loss(model, reference_hidden(model, tokens, masks, scales=scales),
                                                         targets).item(), abs=1e-5)
    params = [p for p in model.parameters()]
    got = torch.autograd.grad(objective, params, allow_unused=True)
    want = torch.autograd.grad(reference, params, allow_unused=True)
    for (name, _), a, b in zip(model.named_parameters(), got, want):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=name)


def test_an_exit_after_a_block_every_row_dropped_sees_that_block_s_input():
    torch.manual_seed(0)
    module = tiny_module(layers=4, early_exit_loss=EarlyExitLossConfig(scale=1.0))
    module.configure_model()
    tokens, targets = torch.randint(0, 64, (2, 4, 16))
    keep, drop_all = torch.ones(4, dtype=torch.bool), torch.zeros(4, dtype=torch.bool)
    drop = DropPlan.from_masks([keep, drop_all, keep, keep], [1.0] * 4)
    _, _, per_exit = module.losses(tokens, targets, drop, {1: 0.5, 2: 0.5})
    assert per_exit[2].item() == per_exit[1].item()  # block 1 ran on no row: exit 2 = exit 1


def test_without_exits_the_objective_is_the_final_layer_loss():
    torch.manual_seed(0)
    module = tiny_module(layers=3)
    module.configure_model()
    tokens, targets = torch.randint(0, 64, (2, 4, 16))
    objective, final, per_exit = module.losses(tokens, targets)
    assert objective is final and per_exit == {}


# ------------------------------------------------------------------- training and logging


def test_training_logs_the_curriculum_s_exits_and_validation_measures_every_exit(tmp_path):
    torch.manual_seed(0)
    cfg = EarlyExitLossConfig(scale=0.5, curriculum="rotational")  # exits 1, 2, 3: {1, 3}, {2}, ...
    module = tiny_module(layers=4, layer_dropout=LayerDropoutConfig(p_max=0.5, seed=3), early_exit_loss=cfg)
    logger = KeepingLogger()
    heads = []

    class RecordStats(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            stats = outputs["stats"]
            heads.append((stats.step, sorted(stats.exit_losses), stats.executed.head, stats.dense.head))

    trainer = quiet_trainer(max_steps=4, logger=logger, limit_val_batches=1, val_check_interval=4,
                            callbacks=[RecordStats()], default_root_dir=tmp_path)
    trainer.fit(module, RandomTokens(batch_size=4))
    one_head = 3 * 2 * 32 * 64 * 4 * 16  # 3 passes · 2·d·V per token · B·S tokens
    assert heads == [(0, [1, 3], 3 * one_head, 3 * one_head), (1, [2], 2 * one_head, 2 * one_head),
                     (2, [1, 3], 3 * one_head, 3 * one_head), (3, [2], 2 * one_head, 2 * one_head)]
    assert [step for step, _ in logger.metrics["early_exit/loss_1"]] == [0, 2]
    assert [step for step, _ in logger.metrics["early_exit/loss_2"]] == [1, 3]
    assert all(math.isfinite(v) for k in (1, 2, 3) for v in logger.values(f"early_exit/loss_{k}"))
    for exit in (1, 2, 3):  # every configured exit, whatever the curriculum
        assert math.isfinite(logger.values(f"val/early_exit/loss_{exit}")[-1])


# ---------------------------------------------------------------------------------- resume

N = 3


def resume_args(data_dir, root, record, *extra):
    callbacks = [{"class_path": "tests.helpers.tiny_training.RecordLosses", "init_args": {"path": str(record)}}]
    return tiny_cli_args(data_dir, root, steps=2 * N, p_max=0.6) + [
        "--model.early_exit_loss.scale", "0.5", "--model.early_exit_loss.curriculum", "gradual",
        "--model.early_exit_loss.weighting", "linear",
        "--checkpoint.every_n_steps", str(N), "--trainer.logger", "false",
        "--trainer.callbacks", json.dumps(callbacks), *extra]


@pytest.mark.slow
def test_resume_in_the_middle_of_the_curriculum_repeats_the_uninterrupted_run(prepared_tokens, tmp_path):
    """Gradual over 6 steps of a 3-layer model (exits 1, 2): exit 2 alone for steps 0-2,
    both from step 3; the crash comes after step 4, the resume starts at step 3's checkpoint."""
    straight, resumed = tmp_path / "straight.jsonl", tmp_path / "resumed.jsonl"
    assert main(resume_args(prepared_tokens, tmp_path / "a", straight)) == 0
    crash = {"class_path": "tests.helpers.tiny_training.CrashAtStep", "init_args": {"step": N + 2}}
    with pytest.raises(SimulatedCrash):
        main(resume_args(prepared_tokens, tmp_path / "b", resumed) + ["--trainer.callbacks+", json.dumps(crash)])
    resumed.unlink()
    assert main(resume_args(prepared_tokens, tmp_path / "b", resumed, "--resume", "auto")) == 0
    expected = [r for r in records(straight) if r["step"] >= N]
    got = records(resumed)
    assert [r["step"] for r in got] == list(range(N, 2 * N))
    assert [r["loss"] for r in got] == [r["loss"] for r in expected]  # bit for bit
    summaries = [json.loads((tmp_path / run / "summary.json").read_text()) for run in ("a", "b")]
    assert summaries[0]["early_exit_loss"]["val_loss"].keys() == {"1", "2"}
    assert summaries[1]["early_exit_loss"] == summaries[0]["early_exit_loss"]

