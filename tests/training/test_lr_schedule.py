import math

import pytest
import torch

from framework.training.lr_schedule import LRScheduleConfig, lr_factor, schedule_for


def reference(step, total, warmup, decay, floor):
    """The schedule written out the long way."""
    if step < warmup:
        return (step + 1) / warmup
    if decay == "constant":
        return 1.0
    progress = (step - warmup) / (total - warmup)
    if decay == "linear":
        return floor + (1 - floor) * (1 - progress)
    return floor + (1 - floor) * (1 + math.cos(math.pi * progress)) / 2


@pytest.mark.parametrize("decay", ["linear", "cosine", "constant"])
@pytest.mark.parametrize("warmup,floor", [(0, 0.0), (10, 0.0), (7, 0.1)])
def test_factor_matches_reference_at_every_step(decay, warmup, floor):
    total = 50
    for step in range(total):
        assert lr_factor(step, total_steps=total, warmup_steps=warmup, decay=decay,
                         min_lr_ratio=floor) == pytest.approx(reference(step, total, warmup, decay, floor))


def test_warmup_rises_linearly_then_linear_decay_reaches_zero_after_last_step():
    f = [lr_factor(t, total_steps=20, warmup_steps=4) for t in range(20)]
    assert f[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert all(b < a for a, b in zip(f[4:], f[5:]))
    assert f[-1] == pytest.approx(1 / 16) and f[-1] > 0
    assert lr_factor(20, total_steps=20, warmup_steps=4) == 0.0  # past the end: held at the floor
    assert lr_factor(99, total_steps=20, warmup_steps=4) == 0.0


def test_cosine_is_halfway_at_mid_decay():
    assert lr_factor(5, total_steps=15, warmup_steps=5, decay="cosine") == pytest.approx(1.0)
    assert lr_factor(10, total_steps=15, warmup_steps=5, decay="cosine") == pytest.approx(0.5)


def test_config_warmup_fraction_and_lambda_lr_drive_the_optimizer():
    cfg = LRScheduleConfig(warmup_fraction=0.1, decay="linear")
    assert cfg.warmup_for(100) == 10
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=2.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule_for(cfg, 100))
    seen = []
    for _ in range(100):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([2.0 * lr_factor(t, total_steps=100, warmup_steps=10) for t in range(100)])
    # A plain function: nothing about the run length goes into the scheduler's state.
    assert sched.state_dict()["lr_lambdas"] == [None]


@pytest.mark.parametrize("kwargs,match", [
    (dict(warmup_steps=-1), "warmup_steps"),
    (dict(warmup_fraction=1.0), "warmup_fraction"),
    (dict(warmup_steps=5, warmup_fraction=0.1), "together"),
    (dict(decay="step"), "decay"),
    (dict(min_lr_ratio=1.5), "min_lr_ratio"),
])
def test_bad_config_is_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LRScheduleConfig(**kwargs)


def test_warmup_must_end_inside_the_run():
    schedule_for(LRScheduleConfig(warmup_steps=9), 10)
    with pytest.raises(ValueError, match="^warmup_steps=10 is invalid: must be < the run's 10 steps$"):
        schedule_for(LRScheduleConfig(warmup_steps=10), 10)
