"""`layerdrop pretrain` on a data mixture end to end: per-source tokens in the progress line,
TensorBoard and summary.json, per-source validation, an anneal on other weights as a resume."""

from __future__ import annotations

import json

import pytest

from framework.training.pretrain import main
from tests.helpers.tiny_training import tiny_cli_args


def _args(sources, root, weights=(0.7, 0.3), steps=6):
    args = tiny_cli_args(sources["email"], root, steps=steps)
    at = args.index("--data.data_dir")
    mixture = {name: {"dir": folder, "weight": weight} for (name, folder), weight in zip(sources.items(), weights)}
    return args[:at] + ["--data.data_dir", "null", "--data.mixture", json.dumps(mixture)] + args[at + 2:] + [
        "--progress_every", "0"]


@pytest.fixture(scope="module")
def mixture_run(mixture_sources, tmp_path_factory):
    root = tmp_path_factory.mktemp("mixture") / "run"
    assert main(_args(mixture_sources, root)) == 0
    return root


def test_the_summary_has_each_sources_tokens_and_val_loss(mixture_run):
    summary = json.loads((mixture_run / "summary.json").read_text())
    sources = summary["data"]["sources"]
    assert list(sources) == ["email", "http"]
    assert sum(source["tokens"] for source in sources.values()) == summary["tokens"] == 6 * 4 * 32
    assert all(source["tokens"] % 32 == 0 and source["tokens"] > 0 for source in sources.values())
    assert [source["weight"] for source in sources.values()] == [0.7, 0.3]
    losses = [source["val_loss"] for source in sources.values()]
    assert all(isinstance(loss, float) for loss in losses)
    assert summary["val_loss"] == pytest.approx(0.7 * losses[0] + 0.3 * losses[1], rel=1e-5)
    assert summary["data"]["phases"] == [{"weights": {"email": 0.7, "http": 0.3}, "start_step": 0, "end_step": 6}]
    assert list(summary["data"]["identity"]) == ["email", "http"]  # each source's data, by its name
    assert all(identity["splits"]["train"]["tokens"] > 0 for identity in summary["data"]["identity"].values())


def test_tensorboard_shows_per_source_tokens_and_losses(mixture_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = EventAccumulator(str(mixture_run / "lightning_logs" / "version_0"))
    scalars.Reload()
    assert {"train/tokens/email", "train/tokens/http", "train/share/email", "val/loss/email", "val/loss/http",
            "val/loss"} <= set(scalars.Tags()["scalars"])


def test_the_progress_line_names_the_sources(mixture_sources, tmp_path, capsys):
    assert main(_args(mixture_sources, tmp_path / "run", steps=2)) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step 2/2")]
    assert lines and ", sources email " in lines[-1] and "http " in lines[-1]


def test_an_anneal_on_other_weights_resumes_at_the_same_step_as_a_new_phase(mixture_sources, tmp_path, capsys):
    root = tmp_path / "run"
    assert main(_args(mixture_sources, root, steps=3)) == 0
    capsys.readouterr()
    assert main(_args(mixture_sources, root, weights=(0.2, 0.8), steps=6) + ["--resume", "auto"]) == 0
    out = capsys.readouterr().out
    assert "data mixture: new weights from step 3 (phase 2): email 0.700 -> 0.200, http 0.300 -> 0.800" in out
    summary = json.loads((root / "summary.json").read_text())
    assert summary["steps"] == 6
    assert summary["data"]["phases"] == [{"weights": {"email": 0.7, "http": 0.3}, "start_step": 0, "end_step": 3},
                                         {"weights": {"email": 0.2, "http": 0.8}, "start_step": 3, "end_step": 6}]
    assert sum(source["tokens"] for source in summary["data"]["sources"].values()) == 6 * 4 * 32


@pytest.mark.parametrize("bad, message", [
    ('{"email": {"dir": "X", "weight": 0}}', "data.mixture.email.weight=0 is invalid"),
    ('{"email": {"dir": "MISSING", "weight": 1}}', "no manifest.json in"),
])
def test_a_bad_mixture_is_one_line_before_any_step(mixture_sources, tmp_path, capsys, bad, message):
    args = _args(mixture_sources, tmp_path / "run")
    args[args.index("--data.mixture") + 1] = bad.replace("X", mixture_sources["email"]).replace(
        "MISSING", str(tmp_path / "missing"))
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_mixture_schedule_anneals_in_one_run(mixture_sources, tmp_path, capsys):
    schedule = [{"from_step": 4, "weights": {"email": 1, "http": 9}}]
    assert main(_args(mixture_sources, tmp_path / "run") + ["--data.mixture_schedule", json.dumps(schedule)]) == 0
    assert "data mixture: new weights from step 4 (phase 2): email 0.700 -> 0.100, http 0.300 -> 0.900" \
        in capsys.readouterr().out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["data"]["phases"] == [{"weights": {"email": 0.7, "http": 0.3}, "start_step": 0, "end_step": 4},
                                         {"weights": {"email": 0.1, "http": 0.9}, "start_step": 4, "end_step": 6}]


def test_a_schedule_without_a_mixture_is_refused(mixture_sources, tmp_path, capsys):
    args = tiny_cli_args(mixture_sources["email"], tmp_path / "run") + [
        "--data.mixture_schedule", '[{"from_step": 2, "weights": {"a": 1}}]']
    assert main(args) == 2
    assert "data.mixture_schedule is invalid without data.mixture" in capsys.readouterr().err
