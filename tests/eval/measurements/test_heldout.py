"""eval heldout: exit losses over slices of held-out data, their standard errors."""

import json
import math
import statistics

import pytest
import torch

from eval.measurements.exits import exit_losses
from eval.measurements.heldout import grouped, heldout_losses, main, paired_standard_error, weighted_mean_and_error
from tests.eval.tiny_lm import tiny_decoder


def batches(count=6, batch=2, seq=9, seed=3):
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, 300, (count * batch, seq + 1), generator=gen)
    return [(rows[i:i + batch, :-1], rows[i:i + batch, 1:]) for i in range(0, count * batch, batch)]


def test_grouped_keeps_order_and_the_short_tail():
    assert [len(g) for g in grouped(range(7), 3)] == [3, 3, 1]
    assert [x for g in grouped(range(7), 3) for x in g] == list(range(7))


def test_weighted_mean_and_error_reduce_to_the_textbook_formula():
    values = [1.0, 2.0, 4.0, 7.0]
    mean, error = weighted_mean_and_error(values, [5, 5, 5, 5])
    assert mean == pytest.approx(statistics.fmean(values))
    assert error == pytest.approx(statistics.stdev(values) / math.sqrt(4))
    mean, _ = weighted_mean_and_error([1.0, 3.0], [1, 3])  # token-weighted
    assert mean == pytest.approx(2.5)
    assert math.isnan(weighted_mean_and_error([1.0], [3])[1])


def test_slices_give_the_same_losses_as_one_pass_and_an_error_per_exit():
    decoder, data = tiny_decoder(n_layers=3), batches()
    whole = exit_losses(decoder, data)
    report = heldout_losses(decoder, data, groups=3, batches_total=len(data))
    assert report["tokens"] == whole["tokens"] == 6 * 2 * 9
    for k, loss in whole["exit_loss"].items():
        assert report["exit_loss"][k] == pytest.approx(loss, rel=1e-9)
        slices = report["groups"]["exit_loss"][k]
        assert len(slices) == 3
        assert report["standard_error"][k] == pytest.approx(statistics.stdev(slices) / math.sqrt(3), rel=1e-9)
    assert report["loss"] == report["exit_loss"]["3"]


def test_the_paired_error_is_the_error_of_the_slice_differences():
    data = batches(count=8)
    a = heldout_losses(tiny_decoder(seed=0), data, groups=4, batches_total=8)
    b = heldout_losses(tiny_decoder(seed=1), data, groups=4, batches_total=8)
    diffs = [x - y for x, y in zip(a["groups"]["exit_loss"]["3"], b["groups"]["exit_loss"]["3"])]
    assert paired_standard_error(a, b) == pytest.approx(statistics.stdev(diffs) / 2, rel=1e-9)
    assert paired_standard_error(a, a) == 0.0
    c = heldout_losses(tiny_decoder(seed=1), data, groups=2, batches_total=8)
    with pytest.raises(ValueError, match="same slices"):
        paired_standard_error(a, c)


def test_cli_refuses_bad_values_before_loading(tmp_path, capsys):
    out = tmp_path / "r.json"
    out.write_text("{}")
    for argv, message in ((["--groups", "1"], "at least 2 slices"), ([], "already exists"),
                          (["--max-tokens", "0"], "positive integer")):
        with pytest.raises(SystemExit) as exit_:
            main(["--ckpt", str(tmp_path / "x.ckpt"), "--data", str(tmp_path), "--out", str(out), *argv])
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err
    assert json.loads(out.read_text()) == {}
