"""`layerdrop eval downstream`: task expansion, early errors, and an offline run."""

import json

import pytest

from eval.downstream import PAPER_TASKS, check_tasks, expand_tasks, force_offline, main, task_manager
from tiny_lm import FIXTURES, TASKS, export_tiny_model

force_offline()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return export_tiny_model(tmp_path_factory.mktemp("downstream") / "model")


def run(argv, capsys):
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr()


def test_paper_expands_to_the_eleven_tasks_of_table_a3():
    assert expand_tasks(["paper"]) == list(PAPER_TASKS) and len(PAPER_TASKS) == 11
    # Duplicates dropped, first occurrence kept.
    assert expand_tasks(["piqa,paper", "copa"]) == ["piqa"] + [t for t in PAPER_TASKS if t != "piqa"]
    with pytest.raises(ValueError, match="--tasks is empty"):
        expand_tasks([" , "])


def test_offline_run_on_local_tasks_writes_the_report(model_dir, tmp_path, capsys, monkeypatch):
    import datasets.config

    monkeypatch.chdir(FIXTURES)  # the task YAMLs name their data files relative to it
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    out = tmp_path / "downstream.json"
    code, captured = run(["--ckpt", model_dir, "--tasks", "ld_tiny_mc,ld_tiny_gen", "--include-path", TASKS,
                          "--no-builtin-tasks", "--limit", 4, "--exit-layer", 2, "--bootstrap-iters", 0,
                          "--out", out], capsys)
    assert code == 0, captured.err
    report = json.loads(out.read_text())
    assert report["tasks"] == ["ld_tiny_mc", "ld_tiny_gen"]
    assert report["summary"]["ld_tiny_mc"]["metric"] == "acc_norm,none"
    assert report["summary"]["ld_tiny_gen"]["metric"] == "exact_match,none"
    assert report["n-samples"]["ld_tiny_mc"]["effective"] == 4
    assert report["model"]["exit_layer"] == 2 and report["model"]["num_layers"] == 3
    assert "ld_tiny_mc" in captured.out  # lm-eval's table


@pytest.mark.parametrize("extra, message", [
    (["--tasks", "ld_tiny_mc,not_a_task"], "unknown task 'not_a_task'"),
    (["--tasks", "ld_tiny_mcq"], "did you mean ld_tiny_mc"),
    (["--tasks", "ld_tiny_mc", "--exit-layer", "0"], "--exit-layer=0 is invalid: must be an integer in 1..3"),
    (["--tasks", "ld_tiny_mc", "--exit-layer", "4"], "--exit-layer=4 is invalid: must be an integer in 1..3"),
    (["--tasks", "ld_tiny_mc", "--skip-layers", "1,3"], "layers [3] are outside 0..2"),
    (["--tasks", "ld_tiny_mc", "--tokenizer", "/no/such/tokenizer.json"], "does not exist"),
])
def test_bad_input_fails_before_the_model_is_loaded(model_dir, tmp_path, capsys, extra, message):
    code, captured = run(["--ckpt", model_dir, "--include-path", TASKS, "--no-builtin-tasks",
                          "--out", tmp_path / "r.json", *extra], capsys)
    assert code == 2 and message in captured.err
    assert not (tmp_path / "r.json").exists()


def test_unknown_task_lists_the_allowed_local_tasks(model_dir, tmp_path, capsys):
    code, captured = run(["--ckpt", model_dir, "--tasks", "nope", "--include-path", TASKS, "--no-builtin-tasks",
                          "--out", tmp_path / "r.json"], capsys)
    assert code == 2
    assert "ld_tiny_gen, ld_tiny_loglik, ld_tiny_mc, ld_tiny_rolling" in captured.err


def test_missing_checkpoint_and_existing_report_are_clear_errors(model_dir, tmp_path, capsys):
    code, captured = run(["--ckpt", tmp_path / "missing", "--tasks", "piqa", "--out", tmp_path / "r.json"], capsys)
    assert code == 2 and "does not exist" in captured.err
    (tmp_path / "r.json").write_text("{}")
    code, captured = run(["--ckpt", model_dir, "--tasks", "piqa", "--out", tmp_path / "r.json"], capsys)
    assert code == 2 and "pass --overwrite" in captured.err


@pytest.mark.slow
def test_paper_tasks_exist_in_lm_evals_index():
    """Indexes lm-eval's ~14k built-in task names (~30 s): the paper's names are real."""
    manager = task_manager([], builtin=True)
    check_tasks(list(PAPER_TASKS), manager, builtin=True)
    with pytest.raises(ValueError, match=r"unknown task 'hellaswagg' \(did you mean hellaswag"):
        check_tasks(["hellaswagg"], manager, builtin=True)
