"""`layerdrop eval downstream`: task expansion, early errors, and an offline run."""

import json
from pathlib import Path

import pytest

from eval.downstream.harness import PAPER_TASKS, expand_tasks, force_offline, main
from eval.downstream.task_index import builtin_folder, check_tasks, declared_names, local_names
from tests.eval.tiny_lm import FIXTURES, TASKS, export_tiny_model
from tests.helpers.in_process import run_main

force_offline()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return export_tiny_model(tmp_path_factory.mktemp("downstream") / "model")


def run(argv, capsys):
    return run_main(main, argv, capsys)


def test_paper_expands_to_the_eleven_tasks_of_table_a3():
    assert expand_tasks(["paper"]) == list(PAPER_TASKS) and len(PAPER_TASKS) == 11
    # Duplicates dropped, first occurrence kept.
    assert expand_tasks(["piqa,paper", "copa"]) == ["piqa"] + [t for t in PAPER_TASKS if t != "piqa"]
    with pytest.raises(ValueError, match="--tasks is empty"):
        expand_tasks([" , "])


def test_offline_run_on_local_tasks_writes_the_report(model_dir, tmp_path, capsys, monkeypatch):
    import datasets.config

    from eval.downstream.lm_eval_adapter import LayerDropLM

    monkeypatch.chdir(FIXTURES)  # the task YAMLs name their data files relative to it
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    out = tmp_path / "downstream.json"
    code, captured = run(["--ckpt", model_dir, "--tasks", "ld_tiny_mc,ld_tiny_gen", "--include-path", TASKS,
                          "--no-builtin-tasks", "--limit", 4, "--exit-layer", 2, "--bootstrap-iters", 0,
                          "--log-samples", "--out", out], capsys)
    assert code == 0, captured.err
    report = json.loads(out.read_text())
    assert report["tasks"] == ["ld_tiny_mc", "ld_tiny_gen"]
    assert report["summary"]["ld_tiny_mc"]["metric"] == "acc_norm,none"
    assert report["summary"]["ld_tiny_gen"]["metric"] == "exact_match,none"
    assert report["n-samples"]["ld_tiny_mc"]["effective"] == 4
    assert report["model"]["exit_layer"] == 2 and report["model"]["num_layers"] == 3
    assert "ld_tiny_mc" in captured.out  # lm-eval's table
    # --log-samples: every request with the answer the model gave, here the text the
    # 2-block model generates greedily for each question (cut at the task's stop strings).
    samples = [json.loads(line) for line in Path(report["samples_file"]).read_text().splitlines()]
    assert sorted({s["task"] for s in samples}) == ["ld_tiny_gen", "ld_tiny_mc"]
    lm = LayerDropLM(ckpt=str(model_dir), exit_layer=2)
    generated = [s for s in samples if s["task"] == "ld_tiny_gen"]
    assert len(generated) == 3
    for sample in generated:
        text = lm.tok_decode(lm.greedy_tokens(lm.tok_encode(sample["doc"]["question"]), 6, ["\n", "."]))
        assert sample["resps"][0][0] == text.split("\n", 1)[0].split(".", 1)[0]
    assert report["summary"]["ld_tiny_gen"]["value"] == sum(
        s["resps"][0][0] == s["doc"]["answer"] for s in generated) / 3


def test_a_data_set_missing_from_the_cache_is_one_line_before_the_model_loads(model_dir, tmp_path, capsys,
                                                                               monkeypatch):
    import framework.checkpoint

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "hub.yaml").write_text("task: ld_hub_task\ndataset_path: some_org/never_cached\ntest_split: test\n"
                                    "output_type: multiple_choice\ndoc_to_text: context\ndoc_to_choice: choices\n"
                                    "doc_to_target: gold\nmetric_list:\n  - metric: acc\n")
    monkeypatch.setattr(framework.checkpoint, "load_decoder", lambda *a, **k: pytest.fail("the model was loaded"))
    code, captured = run(["--ckpt", model_dir, "--tasks", "ld_hub_task", "--include-path", tasks,
                          "--no-builtin-tasks", "--out", tmp_path / "r.json"], capsys)
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert "'some_org/never_cached'" in lines[-1] and "not in the Hugging Face cache" in lines[-1]
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("extra, message", [
    (["--tasks", "ld_tiny_mc,not_a_task"], "unknown task 'not_a_task'"),
    (["--tasks", "ld_tiny_mcq"], "did you mean ld_tiny_mc"),
    (["--tasks", "ld_tiny_mc", "--exit-layer", "0"], "--exit-layer=0 is invalid: must be an integer in 1..3"),
    (["--tasks", "ld_tiny_mc", "--exit-layer", "4"], "--exit-layer=4 is invalid: must be an integer in 1..3"),
    (["--tasks", "ld_tiny_mc", "--skip-layers", "1,3"], "layers [3] are outside 0..2"),
    (["--tasks", "ld_tiny_mc", "--tokenizer", "/no/such/tokenizer.json"], "does not exist"),
    (["--tasks", "ld_tiny_gen", "--max-gen-toks", "64"], "--max-gen-toks=64 is invalid: must be below the context"),
    (["--tasks", "ld_tiny_mc", "--adapters", "/no/adapters"], "has no adapters.safetensors"),
    (["--tasks", "ld_tiny_mc", "--device", "tpu"], "--device 'tpu' is invalid"),
    # issue 46: inf was an OverflowError traceback, nan a traceback inside lm-eval after the
    # model loaded, 2.7 silently scored 2 documents
    *[(["--tasks", "ld_tiny_mc", "--limit", value], f"--limit={value!r} is invalid: a count of documents per task "
       "(an integer >= 1) or a fraction of each task in (0, 1)") for value in ("inf", "nan", "2.7", "0", "-3", "x")],
])
def test_bad_input_fails_before_the_model_is_loaded(model_dir, tmp_path, capsys, extra, message):
    code, captured = run(["--ckpt", model_dir, "--include-path", TASKS, "--no-builtin-tasks",
                          "--out", tmp_path / "r.json", *extra], capsys)
    assert code == 2 and message in captured.err
    assert not (tmp_path / "r.json").exists()


def test_a_limit_is_a_whole_count_or_a_fraction():
    from eval.downstream.harness import document_limit

    assert document_limit("200") == 200 and isinstance(document_limit("200"), int)
    assert document_limit("1e3") == 1000 and document_limit("1.0") == 1 and isinstance(document_limit("1.0"), int)
    assert document_limit("0.25") == 0.25 and document_limit("0.999") == 0.999
    with pytest.raises(ValueError, match=r"^--limit='1.5' is invalid"):
        document_limit("1.5")


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


def test_paper_tasks_are_declared_by_lm_evals_task_files():
    """A second's scan of the YAML text instead of lm-eval's ~30 s index."""
    declared = declared_names(builtin_folder())
    assert set(PAPER_TASKS) <= declared
    check_tasks(list(PAPER_TASKS), [], builtin=True)  # found by the scan: no index built


def test_the_scan_reads_names_as_lm_evals_index_does(tmp_path):
    """Tasks, groups, tags (inline and block lists); a group key makes the file a group."""
    (tmp_path / "a.yaml").write_text("task: alpha\ntag:\n  - family\n  - other # note\ndataset_path: json\n"
                                     "output_type: loglikelihood\ndoc_to_text: x\ndoc_to_target: y\n")
    (tmp_path / "b.yaml").write_text("group: legacy\ntask: beta\ntag: [family]\ndataset_path: json\n"
                                     "output_type: loglikelihood\ndoc_to_text: x\ndoc_to_target: y\n")
    (tmp_path / "g.yaml").write_text("group: both\ntask:\n  - alpha\n  - beta\n")
    assert declared_names(tmp_path) == local_names([str(tmp_path)]) == {"alpha", "both", "family", "legacy", "other"}
    assert declared_names(TASKS) == local_names([str(TASKS)])


def test_unknown_names_are_looked_up_in_the_cached_index(tmp_path, monkeypatch):
    import eval.downstream.task_index as task_index

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(task_index, "declared_names", lambda folder: {"piqa"})
    built = []

    class FakeManager:  # lm-eval's slow index, counted
        def __init__(self, **kwargs):
            built.append(kwargs)
            self.all_tasks = ["piqa", "hellaswag"] if kwargs.get("include_defaults", True) else []

    monkeypatch.setattr("lm_eval.tasks.TaskManager", FakeManager)
    check_tasks(["piqa"], [], builtin=True)
    assert built == []  # found by the scan
    check_tasks(["hellaswag"], [], builtin=True)
    with pytest.raises(ValueError, match=r"unknown task 'hellaswagg' \(did you mean hellaswag"):
        check_tasks(["hellaswagg"], [], builtin=True)
    assert len(built) == 1  # indexed once, then read from the cache
