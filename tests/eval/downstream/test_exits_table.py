"""`--exit-layers`: every exit from one shared forward gives what `--exit-layer K` gives alone."""

import json

import pytest

from eval.downstream.harness import force_offline, main
from tests.eval.tiny_lm import export_tiny_model
from tests.helpers.in_process import run_main

force_offline()
TASKS = "copa,arc_easy"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return export_tiny_model(tmp_path_factory.mktemp("exits") / "model")


@pytest.fixture(autouse=True)
def empty_hf_cache(tmp_path, monkeypatch):
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def run(argv, capsys):
    return run_main(main, argv, capsys)


def samples(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_exit_in_one_pass_equals_each_exit_alone(model_dir, tmp_path, capsys):
    common = ["--ckpt", model_dir, "--tasks", TASKS, "--limit", 3, "--bootstrap-iters", 0, "--log-samples"]
    out = tmp_path / "exits.json"
    code, captured = run([*common, "--exit-layers", "all", "--out", out], capsys)
    assert code == 0, captured.err
    report = json.loads(out.read_text())
    assert report["exits"] == [1, 2, 3] and set(report["table"]) == {"copa", "arc_easy"}
    assert (tmp_path / "exits.png").stat().st_size > 0 and report["plot"] == str(tmp_path / "exits.png")
    assert "exit 1" in captured.out and "scored once for 3 exits" in captured.out
    shared = samples(tmp_path / "exits.samples.jsonl")
    # 3 COPA documents x 2 choices + 3 ARC documents x 4 choices, each scored once for all exits.
    assert report["pairs_scored"] == 18
    for k in (1, 2, 3):
        alone = tmp_path / f"exit{k}.json"
        code, captured = run([*common, "--exit-layer", k, "--out", alone], capsys)
        assert code == 0, captured.err
        single = json.loads(alone.read_text())
        for task in ("copa", "arc_easy"):
            assert report["table"][task][str(k)] == single["summary"][task]["value"]
        mine = {(s["task"], s["doc_id"]): s["resps"] for s in shared if s["exit_layer"] == k}
        theirs = {(s["task"], s["doc_id"]): s["resps"] for s in samples(tmp_path / f"exit{k}.samples.jsonl")}
        assert mine.keys() == theirs.keys()
        for key in mine:
            for a, b in zip(mine[key], theirs[key]):
                assert abs(float(a[0][0]) - float(b[0][0])) < 1e-6 and a[0][1] == b[0][1]


@pytest.mark.parametrize("extra, message", [
    (["--exit-layers", "all", "--exit-layer", "2"], "--exit-layers and --exit-layer are exclusive"),
    (["--exit-layers", "all", "--skip-layers", "1"], "--exit-layers and --skip-layers are exclusive"),
    (["--exit-layers", "2,7"], "[7] outside 1..3"),
    (["--plot", "p.png"], "--plot is the accuracy-by-exit plot of --exit-layers"),
])
def test_exit_layers_refusals(model_dir, tmp_path, capsys, extra, message):
    code, captured = run(["--ckpt", model_dir, "--tasks", "copa", "--out", tmp_path / "r.json", *extra], capsys)
    assert code == 2 and message in captured.err
