"""sweep --done-from: finished runs in a committed report's runs/ copy are adopted, not re-run."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from eval.experiments.sweep.runner import main
from eval.experiments.sweep.spec import load_sweep, run_recipe

REPO = Path(__file__).resolve().parents[4]


def sweep_file(folder: Path, data: Path, lrs=(0.001, 0.002)) -> Path:
    spec = {"base": str(REPO / "recipes" / "tiny.yaml"), "data": {"dir": str(data)},
            "overrides": {"trainer.max_steps": 10, "model.decoder.d_model": 32},
            "grid": {"model.parametrization.lr": list(lrs)}, "seeds": [0, 1],
            "evals": [{"name": "heldout", "command": "eval heldout", "args": {"groups": 2}}]}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def committed_copy(report: Path, sweep_path: Path, names: list[str], *, other_machine: Path) -> None:
    """A report's runs/ copy as another machine left it: its own run and data paths."""
    sweep = load_sweep(sweep_path)
    for run in sweep.runs:
        if run.name not in names:
            continue
        folder = report / "runs" / run.name
        (folder / "evals").mkdir(parents=True)
        recipe = run_recipe(sweep, run, other_machine / "runs" / run.name)
        recipe["data"]["data_dir"] = str(other_machine / "data")
        (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
        (folder / "config.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
        (folder / "summary.json").write_text(json.dumps({"val_loss": 5.0, "steps": 10}))
        (folder / "status.json").write_text(json.dumps({"state": "done", "stages": {"pretrain": {"cpu_seconds": 9}}}))
        (folder / "evals" / "heldout.json").write_text(json.dumps({"loss": 4.9}))


def prepared(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    (data / "manifest.json").write_text("{}")  # prepared: nothing to prepare, nothing here trains
    return data


def test_finished_committed_runs_are_adopted_and_nothing_is_run(tmp_path, capsys):
    data, report = prepared(tmp_path), tmp_path / "docs" / "reproduction"
    path = sweep_file(tmp_path, data)
    names = [r.name for r in load_sweep(path).runs]
    committed_copy(report, path, names, other_machine=Path("/elsewhere/sweeps/x"))
    assert main([str(path), "--out", str(tmp_path / "out"), "--done-from", str(report), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("(adopted, not run)") == 4 and "predicted training compute 0.00e0" not in out
    assert main([str(path), "--out", str(tmp_path / "out"), "--done-from", str(report)]) == 0
    out = capsys.readouterr().out
    assert f"adopted 4 finished runs from {report}" in out and "4 runs: 4 done, 0 to run" in out
    for name in names:
        folder = tmp_path / "out" / "runs" / name
        assert json.loads((folder / "evals" / "heldout.json").read_text()) == {"loss": 4.9}
        status = json.loads((folder / "status.json").read_text())
        assert status["adopted_from"] == str(report) and status["stages"]["pretrain"]["cpu_seconds"] == 9
        # this sweep's own recipe (its paths), so a later run of the sweep accepts the folder
        assert yaml.safe_load((folder / "recipe.yaml").read_text())["trainer"]["default_root_dir"] == \
            str(folder)
        assert not (folder / "logs").exists()  # no subprocess ran
    assert main([str(path), "--out", str(tmp_path / "out")]) == 0  # idempotent without --done-from too


def test_a_relative_out_keeps_the_adopted_recipes_paths_relative(tmp_path, monkeypatch, capsys):
    """A report copies the adopted recipe.yaml: it must not name this machine's folders."""
    data, report = prepared(tmp_path), tmp_path / "docs" / "reproduction"
    path = sweep_file(tmp_path, data)
    names = [r.name for r in load_sweep(path).runs]
    committed_copy(report, path, names, other_machine=Path("/elsewhere/sweeps/x"))
    monkeypatch.chdir(tmp_path)
    assert main([str(path), "--out", "out", "--done-from", str(report)]) == 0
    recipe = yaml.safe_load((tmp_path / "out" / "runs" / names[0] / "recipe.yaml").read_text())
    assert recipe["trainer"]["default_root_dir"] == str(Path("out") / "runs" / names[0])


def test_a_committed_run_of_another_recipe_is_refused_by_name(tmp_path, capsys):
    data, report = prepared(tmp_path), tmp_path / "report"
    path = sweep_file(tmp_path, data)
    committed_copy(report, path, ["lr=0.001,seed=0"], other_machine=tmp_path)
    recipe_file = report / "runs" / "lr=0.001,seed=0" / "recipe.yaml"
    recipe = yaml.safe_load(recipe_file.read_text())
    recipe["trainer"]["max_steps"] = 20
    recipe_file.write_text(yaml.safe_dump(recipe))
    assert main([str(path), "--out", str(tmp_path / "out"), "--done-from", str(report)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "lr=0.001,seed=0" in err and "trainer.max_steps: 20 there, 10 here" in err
    assert not (tmp_path / "out" / "runs").exists()


def test_done_from_a_folder_without_runs_is_an_error(tmp_path, capsys):
    data = prepared(tmp_path)
    path = sweep_file(tmp_path, data)
    assert main([str(path), "--out", str(tmp_path / "out"), "--done-from", str(tmp_path / "nowhere")]) == 2
    assert "--done-from" in capsys.readouterr().err


def test_a_committed_run_trained_on_other_data_is_refused_and_the_same_data_elsewhere_is_adopted(tmp_path, capsys):
    """The run's summary records the data it read (tokenizer sha256, each split's documents and
    tokens); the sweep's folder, prepared on this machine under another path and command, must
    hold the same, else nothing is adopted and one line names the difference."""
    data, report = prepared(tmp_path), tmp_path / "report"
    manifest = {"command": "layerdrop prepare ... --out data/here", "tokenizer": {"file": "tokenizer.json",
                                                                               "sha256": "ab" * 32},
                "splits": {"train": {"path": "train", "documents": 40, "tokens": 9000},
                           "val": {"path": "val", "documents": 2, "tokens": 400}}}
    (data / "manifest.json").write_text(json.dumps(manifest))
    path = sweep_file(tmp_path, data)
    committed_copy(report, path, ["lr=0.001,seed=0"], other_machine=Path("/elsewhere"))
    summary_file = report / "runs" / "lr=0.001,seed=0" / "summary.json"
    identity = {"tokenizer_sha256": "ab" * 32, "splits": {"train": {"documents": 40, "tokens": 9000},
                                                           "val": {"documents": 2, "tokens": 400}}}
    summary_file.write_text(json.dumps({"val_loss": 5.0, "steps": 10, "data": {"identity": {"data": identity}}}))
    only = ["--only", "lr=0.001,seed=0"]
    assert main([str(path), "--out", str(tmp_path / "same"), "--done-from", str(report), *only]) == 0
    assert "adopted 1 finished runs" in capsys.readouterr().out

    identity["splits"]["train"]["tokens"] = 9001  # one more token: another corpus
    summary_file.write_text(json.dumps({"val_loss": 5.0, "steps": 10, "data": {"identity": {"data": identity}}}))
    assert main([str(path), "--out", str(tmp_path / "out"), "--done-from", str(report)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "lr=0.001,seed=0" in err and "other data" in err
    assert "splits.train.tokens: 9001 there, 9000 here" in err
    assert not (tmp_path / "out" / "runs").exists()
