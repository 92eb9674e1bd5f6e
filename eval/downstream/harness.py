"""Downstream benchmarks through lm-evaluation-harness: `layerdrop eval downstream`.

    layerdrop eval downstream --ckpt runs/tiny/checkpoints/last.ckpt --tasks paper --out downstream.json
    layerdrop eval downstream --ckpt CKPT --tasks piqa,hellaswag --exit-layer 4 --limit 200 --out r.json
    layerdrop eval downstream --ckpt CKPT --tasks my_task --include-path my_tasks/ --no-builtin-tasks --out r.json

``paper`` is the 11 tasks of the paper's Table A.3 under their lm-eval names. The run
is offline (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE are forced on): lm-eval's built-in
tasks read their data sets from the Hugging Face cache (``HF_HOME`` /
``HF_DATASETS_CACHE``), so a machine without a hub connection needs that cache filled
beforehand (copied from a machine that ran them once), or local task YAMLs whose
``dataset_path: json`` + ``dataset_kwargs.data_files`` point at JSON/JSONL files, passed
with ``--include-path``. Before the model loads, task names are checked
(eval/downstream/task_index.py: a second for declared names; lm-eval's ~30 s index once, then
cached, for the rest), then the tasks' data sets are read, so a data set missing from
the cache is one line naming it. lm-eval still indexes its ~14k built-in names to run
them, which ``--no-builtin-tasks`` skips when only include-path tasks are wanted.
``--log-samples`` writes every request with the model's answer (the generated text
too) to ``<out>.samples.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Sequence

from framework.atomic_write import write_json
from eval import options
from framework.command_parser import CommandParser

PAPER_TASKS = ("bbh", "piqa", "social_iqa", "hellaswag", "winogrande", "arc_challenge", "arc_easy",
               "openbookqa", "lambada_openai", "copa", "race")
_OFFLINE_ENV = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# The metric a summary row shows for a task, first present wins.
_PRIMARY_METRICS = ("acc_norm,none", "acc,none", "exact_match,get-answer", "exact_match,strict-match",
                    "exact_match,flexible-extract", "exact_match,none", "word_perplexity,none")


def force_offline() -> None:
    """No hub access, even when `datasets`/`huggingface_hub` were imported before."""
    for name in _OFFLINE_ENV:
        os.environ[name] = "1"
    if "datasets" in sys.modules:
        import datasets.config

        datasets.config.HF_DATASETS_OFFLINE = True
        datasets.config.HF_HUB_OFFLINE = True
    if "huggingface_hub" in sys.modules:
        import huggingface_hub.constants

        huggingface_hub.constants.HF_HUB_OFFLINE = True


def expand_tasks(specs: Sequence[str]) -> list[str]:
    """Comma/space separated names, ``paper`` expanded, duplicates dropped, order kept."""
    names: dict[str, None] = {}
    for spec in specs:
        for name in (part.strip() for part in spec.split(",")):
            if not name:
                continue
            for task in (PAPER_TASKS if name == "paper" else (name,)):
                names.setdefault(task, None)
    if not names:
        raise ValueError("--tasks is empty: give 'paper' or lm-eval task names (piqa,hellaswag,...)")
    return list(names)


def task_manager(include_paths: Sequence[str], builtin: bool):
    from lm_eval.tasks import TaskManager

    for path in include_paths:
        if not Path(path).is_dir():
            raise ValueError(f"--include-path {path!r} is not a folder of task YAMLs")
    return TaskManager(include_path=list(include_paths) or None, include_defaults=builtin)


def load_task_data(manager, tasks: Sequence[str]) -> list:
    """The tasks, data sets read (what simple_evaluate would do after loading the model);
    a data set that is neither cached nor local is one ValueError naming it."""
    try:
        loaded = manager.load(list(tasks))
    except ConnectionError as err:  # datasets/huggingface_hub in offline mode
        match = re.search(r"reach '([^']+)'", str(err))
        name = match.group(1) if match else str(err).splitlines()[0]
        cache = os.environ.get("HF_DATASETS_CACHE") or os.environ.get("HF_HOME") or "~/.cache/huggingface"
        raise ValueError(f"the data set {name!r} of these tasks is not in the Hugging Face cache ({cache}) and "
                         "runs are offline: run the task once where the hub is reachable and copy the cache here, "
                         "or use a local task YAML (dataset_path: json) with --include-path") from None
    return [loaded["groups"].get(name) or loaded["tasks"].get(name) or name for name in tasks]


def primary_metric(metrics: dict) -> tuple[str, float] | None:
    for key in _PRIMARY_METRICS:
        if isinstance(metrics.get(key), (int, float)):
            return key, float(metrics[key])
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and "stderr" not in key and key != "samples":
            return key, float(value)
    return None


def build_report(results: dict, tasks: Sequence[str], model_info: dict, limit: float | None) -> dict:
    table = {**results.get("results", {}), **results.get("groups", {})}
    summary = {}
    for task in tasks:
        picked = primary_metric(table.get(task, {}))
        if picked is not None:
            summary[task] = {"metric": picked[0], "value": picked[1]}
    import lm_eval

    return {"model": model_info, "tasks": list(tasks), "summary": summary,
            "results": results.get("results", {}), "groups": results.get("groups", {}),
            "n-shot": results.get("n-shot", {}), "n-samples": results.get("n-samples", {}),
            "versions": results.get("versions", {}), "higher_is_better": results.get("higher_is_better", {}),
            "limit": limit, "lm_eval_version": getattr(lm_eval, "__version__", None)}


def _json_safe(value):
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):  # numpy / torch scalars
        return _json_safe(value.item())
    return str(value)


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="layerdrop eval downstream",
                                     description="Downstream benchmarks of a checkpoint through lm-eval (offline). "
                                                 f"Layer numbering: {options.LAYERS}.")
    options.add_checkpoint(parser)
    parser.add_argument("--tasks", nargs="+", required=True,
                        help=f"'paper' ({','.join(PAPER_TASKS)}) and/or lm-eval task names, comma separated")
    parser.add_argument("--include-path", nargs="+", action="extend", default=[], metavar="DIR",
                        help="folders of extra task YAMLs (e.g. local JSON/JSONL data sets)")
    parser.add_argument("--no-builtin-tasks", action="store_true",
                        help="index only --include-path tasks (skips lm-eval's ~14k built-in names, ~30 s)")
    parser.add_argument("--limit", type=float, default=None,
                        help="examples per task (a fraction if < 1); for quick checks, not for reporting")
    parser.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (default: the task's)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per forward (default 8)")
    parser.add_argument("--exit-layer", type=int, default=None, help=options.EXIT_HELP)
    parser.add_argument("--skip-layers", default=None, help=options.SKIP_HELP)
    options.add_adapters(parser, "with --exit-layer K, the exit reads through the adapter trained at K")
    options.add_tokenizer(parser)
    parser.add_argument("--max-length", type=int, default=None, help="context window (default: max_seq_len)")
    parser.add_argument("--max-gen-toks", type=int, default=None,
                        help="generation budget of tasks that set none (default: 256, at most half the context)")
    parser.add_argument("--log-samples", action="store_true",
                        help="write every request and the model's answer to <out>.samples.jsonl")
    parser.add_argument("--bootstrap-iters", type=int, default=100000,
                        help="bootstrap resamples for standard errors of non-mean metrics (0: none)")
    parser.add_argument("--seed", type=int, default=0,
                        help="few-shot sampling, sampled generation, python/numpy/torch seeds")
    options.add_device(parser)
    options.add_output(parser)
    return parser


def _check_model_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from eval.skip_sets import parse_skip_set
    from eval.tokenizer import find_tokenizer
    from framework.checkpoint import CheckpointError, read_model_config

    options.refuse_existing(parser, [args.out, samples_path(args.out) if args.log_samples else None],
                            args.overwrite)
    options.check_positive(parser, args, ("batch_size", "max_length", "num_fewshot", "max_gen_toks"),
                           zero_ok=("num_fewshot",))
    if args.limit is not None and args.limit <= 0:
        parser.error(f"--limit={args.limit} is invalid: must be positive")
    options.check_checkpoint(parser, args.ckpt)
    args.device = str(options.resolve_device(parser, args.device))
    try:
        cfg = read_model_config(args.ckpt)
    except (CheckpointError, FileNotFoundError) as err:
        parser.error(str(err))
    n = cfg.n_layers
    if args.exit_layer is not None and not 1 <= args.exit_layer <= n:
        parser.error(f"--exit-layer={args.exit_layer} is invalid: must be an integer in 1..{n}")
    window = args.max_length or cfg.max_seq_len
    if args.max_gen_toks is not None and args.max_gen_toks >= window:
        parser.error(f"--max-gen-toks={args.max_gen_toks} is invalid: must be below the context ({window} tokens), "
                     "which also holds the prompt")
    try:
        args.skip = list(parse_skip_set(args.skip_layers, n)) if args.skip_layers else []
        if args.adapters is not None:
            _check_adapters(args.adapters, args.exit_layer, args.skip)
        if args.tokenizer is None:
            find_tokenizer(args.ckpt)
        elif not Path(args.tokenizer).is_file():
            raise ValueError(f"--tokenizer {args.tokenizer!r} does not exist")
    except (ValueError, CheckpointError) as err:
        parser.error(str(err))


def _check_adapters(folder: str, exit_layer: int | None, skip: list[int]) -> None:
    from eval.adapters.exit_adapters import read_meta

    exits = read_meta(folder)["exits"]
    if exit_layer not in exits or skip:
        raise ValueError(f"--adapters {folder!r} needs --exit-layer set to one of their exits {exits} "
                         "(and no --skip-layers)")


def samples_path(out: str) -> Path:
    return Path(out).with_suffix(".samples.jsonl")


def write_samples(results: dict, path: Path) -> int:
    """Every logged sample as one JSON line, its task first; the number written."""
    lines = [json.dumps({"task": task, **_json_safe(sample)})
             for task, samples in (results.get("samples") or {}).items() for sample in samples]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return len(lines)


def main(argv: list[str] | None = None) -> int:
    from eval.downstream.task_index import check_tasks

    parser = _parser()
    args = parser.parse_args(argv)
    try:
        tasks = expand_tasks(args.tasks)
    except ValueError as err:
        parser.error(str(err))
    _check_model_args(parser, args)
    force_offline()
    builtin = not args.no_builtin_tasks
    try:
        check_tasks(tasks, args.include_path, builtin, PAPER_TASKS)
        manager = task_manager(args.include_path, builtin=builtin)
        task_objects = load_task_data(manager, tasks)
    except ValueError as err:
        parser.error(str(err))

    import lm_eval
    from lm_eval.utils import make_table

    import eval.downstream.lm_eval_adapter  # noqa: F401  (registers the "layerdrop" model)

    limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
    model_args = {"ckpt": args.ckpt, "tokenizer": args.tokenizer, "exit_layer": args.exit_layer,
                  "skip_layers": args.skip or None, "adapters": args.adapters, "max_length": args.max_length,
                  "max_gen_toks": args.max_gen_toks, "eot_token": args.eot_token, "seed": args.seed}
    results = lm_eval.simple_evaluate(
        model="layerdrop", model_args={k: v for k, v in model_args.items() if v is not None}, tasks=task_objects,
        num_fewshot=args.num_fewshot, batch_size=args.batch_size, device=args.device, limit=limit,
        task_manager=manager, log_samples=args.log_samples, bootstrap_iters=args.bootstrap_iters,
        random_seed=args.seed, numpy_random_seed=args.seed, torch_random_seed=args.seed,
        fewshot_random_seed=args.seed)
    model_info = {k: v for k, v in results.get("config", {}).items()
                  if k in ("ckpt", "tokenizer", "exit_layer", "skip_layers", "adapters", "num_layers", "parameters")}
    report = _json_safe(build_report(results, tasks, model_info, limit))
    if args.log_samples:
        report["samples_file"] = str(samples_path(args.out))
        count = write_samples(results, samples_path(args.out))
    write_json(args.out, report)
    print(make_table(results))
    if args.log_samples:
        print(f"wrote {count} samples to {report['samples_file']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
