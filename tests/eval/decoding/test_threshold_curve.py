"""`layerdrop eval dynamic`: the curve's ends are known quantities."""

from __future__ import annotations

import json

import pytest

from eval.decoding.threshold_curve import agreement, curve_figure, main, threshold_groups
from eval.measurements.exits import exit_losses
from eval.inputs import ValidationData
from framework.checkpoint import export_decoder, load_decoder
from tiny_lm import tiny_decoder
from tests.helpers.checkpoint_run import count_checkpoint_opens


def test_agreement_counts_positions_and_the_first_difference():
    assert agreement([[1, 2, 3, 4]], [[1, 2, 9, 4]]) == (0.75, 0.5)
    assert agreement([[1, 2], [5]], [[1, 2], [6]]) == (2 / 3, 2 / 3)


def test_the_command_reports_the_full_model_and_the_first_exit_at_the_ends(prepared_tokens, tmp_path, capsys,
                                                                           monkeypatch):
    model = tmp_path / "tiny" / "export"  # a run's export: named by the run, as every command names it
    export_decoder(tiny_decoder(seed=3), model)
    out = tmp_path / "dynamic.json"
    opened = count_checkpoint_opens(monkeypatch)
    code = main(["--ckpt", str(model), "--data", str(prepared_tokens), "--thresholds", "0,0.02,1",
                 "--exits", "1,2", "--num-prompts", "3", "--prompt-len", "8", "--max-new-tokens", "6",
                 "--batches", "1", "--batch-size", "4", "--seq-len", "32", "--threads", "1", "--out", str(out)])
    assert code == 0 and opened == [model]  # opened and proven once for the whole command
    report = json.loads(out.read_text())
    rows = {r["threshold"]: r for r in report["thresholds"]}
    decoder, _ = load_decoder(model)
    data = list(ValidationData(str(prepared_tokens), seq_len=32, batch_size=4, max_tokens=None, max_batches=1,
                               model_vocab_size=300))
    exits = exit_losses(decoder, data)["exit_loss"]
    # Threshold 1: the full model. Threshold 0: every token at exit 1, whose K/V (block 0's)
    # are exact whatever the later layers hold, so its loss is plain early exit's.
    assert rows[1.0]["agreement"] == rows[1.0]["prefix_agreement"] == 1.0
    assert rows[1.0]["layers_per_token"] == rows[1.0]["loss_layers_per_token"] == 3
    assert rows[1.0]["loss"] == pytest.approx(exits["3"], abs=1e-5)
    assert rows[0.0]["layers_per_token"] == rows[0.0]["loss_layers_per_token"] == 1
    assert rows[0.0]["loss"] == pytest.approx(exits["1"], abs=1e-5)
    assert 1 <= rows[0.02]["loss_layers_per_token"] <= 3
    assert report["candidates"] == [1, 2] and report["num_layers"] == 3
    assert (tmp_path / "dynamic.png").read_bytes()[:4] == b"\x89PNG"
    assert report["label"] == "tiny" and "tiny: threshold 1" in capsys.readouterr().out


def test_the_plot_says_what_it_plots_and_thresholds_on_one_point_share_a_label():
    """dynamic.png: threshold labels on one point overlapped, the axes named no units and the
    checkpoint was `last.ckpt` here but `tiny` in eval exits."""
    rows = [{"threshold": t, "layers_per_token": lpt, "agreement": agree, "prefix_agreement": agree, "loss": loss}
            for t, lpt, agree, loss in [(0.0, 2.0, 0.4, 6.6), (0.1, 5.1, 0.95, 6.3), (0.5, 8.0, 1.0, 6.2),
                                        (0.9, 8.0, 1.0, 6.2), (1.0, 8.0, 1.0, 6.2)]]
    fig = curve_figure({"num_layers": 6, "adapters": True, "thresholds": rows}, "tiny")
    top, bottom = fig.axes
    assert [a.get_text() for a in top.texts] == ["τ 0", "τ 0.1", "τ 0.5–1 (3)"]
    assert len({a.xy for a in top.texts}) == len(top.texts)
    assert "Dynamic early exit of tiny" in top.get_title()
    assert bottom.get_xlabel() == "blocks run per token (full decoding: 6; an adapter block counts one)"
    assert "(share)" in top.get_ylabel() and "nats/token" in bottom.get_ylabel()
    assert "full decoding: 6 blocks per token" in [t.get_text() for t in top.get_legend().get_texts()]
    assert "full decoding (τ = 1)" in [t.get_text() for t in bottom.get_legend().get_texts()]
    assert threshold_groups(rows[:1] + rows[2:4] + rows[1:2])[-1] == (8.0, 1.0, "τ 0.5, 0.9")
    apart = [{**rows[0], "threshold": 0.3}, rows[1], {**rows[0], "threshold": 0.2}, rows[2]]  # 0.2, 0.3 on one point
    assert [text for _, _, text in threshold_groups(apart)] == ["τ 0.2, 0.3", "τ 0.1", "τ 0.5"]


@pytest.mark.parametrize("args, message", [
    (["--thresholds", "0.5,1.2"], r"threshold=1.2 is invalid: must be in [0, 1]"),
    (["--thresholds", "high"], "--thresholds 'high' is invalid"),
    (["--exits", "4"], "--exits '4' is invalid: candidate exits must be in 1..2 (exit K runs blocks 0..K-1"),
    (["--exits", "3"], "--exits '3' is invalid: candidate exits must be in 1..2"),  # one rule, before the model
    (["--max-new-tokens", "64"], "--max-new-tokens=64 is invalid"),
])
def test_bad_input_is_one_line(prepared_tokens, tmp_path, capsys, args, message):
    export_decoder(tiny_decoder(seed=3), tmp_path / "model")
    with pytest.raises(SystemExit) as exit_info:
        main(["--ckpt", str(tmp_path / "model"), "--data", str(prepared_tokens), "--out", str(tmp_path / "r.json"),
              *args])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
