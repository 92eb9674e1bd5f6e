"""benchmarks/quality_bar.py end to end on the suite's data: both baselines train on the
same batches, --jobs 2 gives the rows --jobs 1 gives (each point is its own seeded
process), the table and verdict read the JSON, and bad arguments stop before training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "quality_bar.py"


def recipe(tmp_path: Path) -> Path:
    config = {"seed_everything": 0,
              "model": {"decoder": {"vocab_size": 300, "d_model": 16, "n_layers": 2, "n_heads": 2,
                                    "max_seq_len": 32, "init_std": 0.02},
                        "lr_schedule": {"warmup_steps": 1, "decay": "linear"}},
              "data": {"seq_len": 32, "batch_size": 4, "seed": 0}, "trainer": {"max_steps": 4}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def quality_bar(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


@pytest.mark.slow
def test_both_trainers_run_and_jobs_do_not_change_the_rows(tmp_path, prepared_tokens):
    config = recipe(tmp_path)
    common = ["--config", str(config), "--data", str(prepared_tokens), "--lrs", "1e-3", "4e-3",
              "--peer-lrs", "2e-3", "--heldout-tokens", "512", "--threads", "1"]
    one = quality_bar(*common, "--out", str(tmp_path / "one.json"))
    two = quality_bar(*common, "--jobs", "2", "--out", str(tmp_path / "two.json"))
    assert one.returncode == two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
    first, second = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    for key in ("plain", "peer"):
        losses = [(r["lr"], r["heldout_loss"], r["final_train_loss"]) for r in first[key]["rows"]]
        assert losses == [(r["lr"], r["heldout_loss"], r["final_train_loss"]) for r in second[key]["rows"]]
    assert [r["lr"] for r in first["plain"]["rows"]] == [1e-3, 4e-3]
    assert first["plain"]["best"]["heldout_loss"] == min(r["heldout_loss"] for r in first["plain"]["rows"])
    assert first["heldout_tokens"] == 512
    assert first["partial"] is False
    # an interrupted or widened grid: the points done are read back, only the new one trains
    before = (tmp_path / "one.json").read_text()
    refused = quality_bar(*common, "--steps", "3", "--out", str(tmp_path / "one.json"))
    assert refused.returncode == 1 and "holds results of other settings" in refused.stderr
    assert (tmp_path / "one.json").read_text() == before
    wider = quality_bar(*common, "--lrs", "1e-3", "4e-3", "8e-3", "--out", str(tmp_path / "one.json"))
    assert wider.returncode == 0 and "3 points done earlier" in wider.stdout and wider.stdout.count("held-out loss") == 1
    widened = json.loads((tmp_path / "one.json").read_text())
    assert widened["plain"]["rows"][:2] == first["plain"]["rows"] and widened["plain"]["rows"][2]["lr"] == 8e-3
    run = tmp_path / "framework-run"  # a finished sweep run's files, as the framework's row reads them
    (run / "evals").mkdir(parents=True)
    (run / "evals" / "heldout.json").write_text(json.dumps({"loss": 5.0, "tokens": 512}))
    shown = quality_bar("--table", "--framework", str(run), "--out", str(tmp_path / "two.json"))
    assert shown.returncode == 0 and "LlamaForCausalLM (transformers), AdamW" in shown.stdout
    bar = min(first[key]["best"]["heldout_loss"] for key in ("plain", "peer"))
    assert f"{100 * (5.0 / bar - 1):+.2f}% against the better baseline's {bar:.4f}" in shown.stdout
    assert json.loads((tmp_path / "two.json").read_text())["framework"]["heldout_loss"] == 5.0


@pytest.mark.parametrize("args, message", [
    (["--jobs", "0"], "--jobs=0 is invalid: must be >= 1"),
    (["--lrs", "-1"], "every η must be > 0"),
    ([], "--config and --data are required"),
    (["--table", "--out", "/nonexistent/quality_bar.json"], "does not exist: run the grid first"),
])
def test_bad_arguments_stop_before_training(tmp_path, args, message):
    needed = ["--config", str(recipe(tmp_path)), "--data", str(tmp_path)] if args else []
    result = quality_bar(*needed, *args)
    assert result.returncode == 2 and message in result.stderr


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_file_it_did_not_write_is_never_replaced(tmp_path, overwrite):
    notes, folder = tmp_path / "notes.json", tmp_path / "a-folder"
    notes.write_text('{"mine": true}')
    folder.mkdir()
    for out in (notes, folder):
        result = quality_bar("--config", str(recipe(tmp_path)), "--data", str(tmp_path), "--out", str(out), *overwrite)
        assert result.returncode == 1 and "is not this script's JSON: it is never replaced" in result.stderr
    assert notes.read_text() == '{"mine": true}' and not any(folder.iterdir())
