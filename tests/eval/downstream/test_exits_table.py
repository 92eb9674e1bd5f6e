"""`--exit-layers` / `--sets` / `--adapters`: every exit, adapter exit and skip set of one run gives
what `--exit-layer K`, `--exit-layer K --adapters DIR` and `--skip-layers S` give alone."""

import json

import pytest
import torch

from eval.downstream.harness import force_offline, main
from tests.eval.tiny_lm import export_tiny_model, tiny_decoder
from tests.helpers.in_process import run_main

force_offline()
TASKS = "copa,arc_easy"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return export_tiny_model(tmp_path_factory.mktemp("exits") / "model")


def write_adapters(folder, decoder, exits):
    from eval.adapters.exit_adapters import ExitAdapters, save_adapters

    torch.manual_seed(1)
    adapters = ExitAdapters(decoder.config, exits)
    adapters.initialise(decoder, "random")  # not a copy of the last block: its exit would equal the full model's
    return save_adapters(adapters, folder, {"backbone": "tiny", "model": decoder.config.to_dict()})


@pytest.fixture(scope="module")
def adapters_dir(tmp_path_factory):
    return write_adapters(tmp_path_factory.mktemp("adapters") / "adapters", tiny_decoder(), [1, 2])


@pytest.fixture(scope="module")
def foreign_adapters(tmp_path_factory):
    return write_adapters(tmp_path_factory.mktemp("foreign") / "adapters", tiny_decoder(n_layers=4), [1, 2])


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


def assert_same_requests(shared, column, alone):
    """Every request of ``column`` in the one-run samples has the log-likelihood (within 1e-5)
    and greedy flag of the separate run."""
    mine = {(s["task"], s["doc_id"]): s["resps"] for s in shared if s["column"] == column}
    theirs = {(s["task"], s["doc_id"]): s["resps"] for s in alone}
    assert mine.keys() == theirs.keys() and mine
    for key in mine:
        for a, b in zip(mine[key], theirs[key]):
            assert abs(float(a[0][0]) - float(b[0][0])) <= 1e-5 and a[0][1] == b[0][1]


def test_skip_sets_and_adapter_exits_in_one_run_equal_their_own_runs(model_dir, adapters_dir, tmp_path, capsys):
    common = ["--ckpt", model_dir, "--tasks", TASKS, "--limit", 3, "--bootstrap-iters", 0, "--log-samples"]
    out = tmp_path / "table.json"
    # adapters at exits 1 and 2: only 2 is among --exit-layers, so only it gets a column
    code, captured = run([*common, "--exit-layers", "2,3", "--sets", "alternate-odd", "--adapters", adapters_dir,
                          "--out", out], capsys)
    assert code == 0, captured.err
    report = json.loads(out.read_text())
    assert report["columns"] == ["2", "3", "adapter:2", "skip:1"] and report["adapter_exits"] == [2]
    assert report["skip_sets"]["skip:1"]["name"] == "alternate-odd"
    assert report["pairs_scored"] == 18 and report["skip_pairs_scored"] == 18  # one shared pass, one skip pass
    assert "adapter 2" in captured.out and "skip alternate-odd" in captured.out
    assert "scored once for 2 exits and adapter exits 2" in captured.out
    assert (tmp_path / "table.png").stat().st_size > 0
    shared = samples(tmp_path / "table.samples.jsonl")
    for column, flags in (("adapter:2", ["--exit-layer", 2, "--adapters", adapters_dir]),
                          ("skip:1", ["--skip-layers", "alternate-odd"])):
        alone = tmp_path / f"{column.replace(':', '-')}.json"
        code, captured = run([*common, *flags, "--out", alone], capsys)
        assert code == 0, captured.err
        single = json.loads(alone.read_text())
        for task in ("copa", "arc_easy"):
            assert report["table"][task][column] == single["summary"][task]["value"]
        assert_same_requests(shared, column, samples(alone.with_suffix(".samples.jsonl")))


@pytest.fixture
def no_model_load(monkeypatch):
    """Refusals come before the model loads: loading it fails the test."""
    import eval.downstream.lm_eval_adapter as adapter

    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(adapter, "load_decoder", load)


@pytest.mark.parametrize("extra, message", [
    (["--exit-layers", "all", "--exit-layer", "2"], "--exit-layers and --exit-layer are exclusive"),
    (["--exit-layers", "all", "--skip-layers", "1"], "--exit-layers and --skip-layers are exclusive"),
    (["--sets", "1", "--exit-layer", "2"], "--sets and --exit-layer are exclusive"),
    (["--exit-layers", "2,7"], "[7] outside 1..3"),
    (["--plot", "p.png"], "--plot is the accuracy-by-exit plot of --exit-layers / --sets"),
    (["--sets", "odd"], "skip set 'odd' is invalid: allowed: none, alternate-odd"),
    (["--sets", "1,5"], "layers [5] are outside 0..2"),
    (["--exit-layers", "all", "--sets", "0-2"], "it skips all 3 layers"),
    (["--sweep", "halves"], "invalid choice: 'halves'"),
    (["--exit-layers", "all", "--adapters", "MISSING"], "has no adapters.safetensors"),
    (["--exit-layers", "all", "--adapters", "FOREIGN"], "were trained for another model than --ckpt (n_layers 4 vs 3)"),
    (["--exit-layer", "1", "--adapters", "FOREIGN"], "were trained for another model than --ckpt"),
    (["--exit-layers", "3", "--adapters", "ADAPTERS"], "has exits [1, 2]: give --exit-layers naming some of them"),
    (["--sets", "1", "--adapters", "ADAPTERS"], "give --exit-layers naming some of them (got none)"),
])
def test_table_refusals(model_dir, adapters_dir, foreign_adapters, tmp_path, capsys, no_model_load, extra, message):
    folders = {"MISSING": tmp_path / "nothing", "FOREIGN": foreign_adapters, "ADAPTERS": adapters_dir}
    extra = [folders.get(value, value) for value in extra]
    code, captured = run(["--ckpt", model_dir, "--tasks", "copa", "--out", tmp_path / "r.json", *extra], capsys)
    assert code == 2 and message in captured.err
    assert len(captured.err.strip().splitlines()[-1]) > 0 and not (tmp_path / "r.json").exists()
