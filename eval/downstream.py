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
with ``--include-path``. Task names are checked against lm-eval's index (built-in +
include path) before the model is loaded; indexing the ~14k built-in names takes
~30 s, which ``--no-builtin-tasks`` skips when only include-path tasks are wanted.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import sys
from pathlib import Path
from typing import Sequence

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


def check_tasks(names: Sequence[str], manager, builtin: bool) -> None:
    """Every name must be a task, group or tag the manager indexed."""
    known = set(manager.all_tasks)
    unknown = [name for name in names if name not in known]
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
        hints.append(f"{name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    if builtin:
        allowed = (f"'paper' ({','.join(PAPER_TASKS)}) or one of lm-eval's {len(known)} task/group/tag "
                   "names (list them with `lm-eval ls tasks`) or a task under --include-path")
    else:
        allowed = f"'paper' or a task under --include-path: {', '.join(sorted(known)) or '(none found)'}"
    raise ValueError(f"unknown task {', '.join(hints)}; allowed: {allowed}")


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
    parser = argparse.ArgumentParser(prog="layerdrop eval downstream",
                                     description="Downstream benchmarks of a checkpoint through lm-eval (offline).")
    parser.add_argument("--ckpt", required=True, help="a .ckpt from `layerdrop pretrain` or an exported folder")
    parser.add_argument("--tasks", nargs="+", required=True,
                        help=f"'paper' ({','.join(PAPER_TASKS)}) and/or lm-eval task names, comma separated")
    parser.add_argument("--include-path", nargs="+", action="extend", default=[], metavar="DIR",
                        help="folders of extra task YAMLs (e.g. local JSON/JSONL data sets)")
    parser.add_argument("--no-builtin-tasks", action="store_true",
                        help="index only --include-path tasks (skips lm-eval's ~14k built-in names, ~30 s)")
    parser.add_argument("--limit", type=float, default=None,
                        help="examples per task (a fraction if < 1); for quick checks, not for reporting")
    parser.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (default: the task's)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:N (default: cuda if available)")
    parser.add_argument("--exit-layer", type=int, default=None, help="early exit: run blocks 0..k-1 (1..L)")
    parser.add_argument("--skip-layers", default=None,
                        help="skip set: alternate-odd, alternate-even, a-b, or a list i,j,k")
    parser.add_argument("--tokenizer", default=None, help="tokenizer.json (default: beside the checkpoint "
                                                          "or in the data folder it was trained on)")
    parser.add_argument("--eot-token", default=None, help="end-of-text token (default: the data's EOS)")
    parser.add_argument("--max-length", type=int, default=None, help="context window (default: max_seq_len)")
    parser.add_argument("--bootstrap-iters", type=int, default=100000,
                        help="bootstrap resamples for standard errors of non-mean metrics (0: none)")
    parser.add_argument("--seed", type=int, default=0, help="few-shot sampling and python/numpy/torch seeds")
    parser.add_argument("--out", required=True, metavar="JSON", help="report path")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing report")
    return parser


def _check_model_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from eval.lm_eval_adapter import find_tokenizer
    from eval.skip_sets import parse_skip_set
    from framework.checkpoint import CheckpointError, read_model_config

    if Path(args.out).exists() and not args.overwrite:
        parser.error(f"{args.out!r} already exists; pass --overwrite to replace it")
    for name in ("batch_size", "max_length", "num_fewshot"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "num_fewshot" else 1):
            parser.error(f"--{name.replace('_', '-')}={value} is invalid: must be a "
                         f"{'non-negative' if name == 'num_fewshot' else 'positive'} integer")
    if args.limit is not None and args.limit <= 0:
        parser.error(f"--limit={args.limit} is invalid: must be positive")
    if not Path(args.ckpt).exists():
        parser.error(f"checkpoint {args.ckpt!r} does not exist")
    try:
        cfg = read_model_config(args.ckpt)
    except (CheckpointError, FileNotFoundError) as err:
        parser.error(str(err))
    n = cfg.n_layers
    if args.exit_layer is not None and not 1 <= args.exit_layer <= n:
        parser.error(f"--exit-layer={args.exit_layer} is invalid: must be an integer in 1..{n}")
    try:
        args.skip = list(parse_skip_set(args.skip_layers, n)) if args.skip_layers else []
        if args.tokenizer is None:
            find_tokenizer(args.ckpt)
        elif not Path(args.tokenizer).is_file():
            raise ValueError(f"--tokenizer {args.tokenizer!r} does not exist")
    except ValueError as err:
        parser.error(str(err))


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        tasks = expand_tasks(args.tasks)
    except ValueError as err:
        parser.error(str(err))
    _check_model_args(parser, args)
    force_offline()
    try:
        manager = task_manager(args.include_path, builtin=not args.no_builtin_tasks)
        check_tasks(tasks, manager, builtin=not args.no_builtin_tasks)
    except ValueError as err:
        parser.error(str(err))

    import lm_eval
    from lm_eval.utils import make_table

    import eval.lm_eval_adapter  # noqa: F401  (registers the "layerdrop" model)

    limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
    model_args = {"ckpt": args.ckpt, "tokenizer": args.tokenizer, "exit_layer": args.exit_layer,
                  "skip_layers": args.skip or None, "max_length": args.max_length, "eot_token": args.eot_token}
    results = lm_eval.simple_evaluate(
        model="layerdrop", model_args={k: v for k, v in model_args.items() if v is not None}, tasks=tasks,
        num_fewshot=args.num_fewshot, batch_size=args.batch_size, device=args.device, limit=limit,
        task_manager=manager, log_samples=False, bootstrap_iters=args.bootstrap_iters, random_seed=args.seed,
        numpy_random_seed=args.seed, torch_random_seed=args.seed, fewshot_random_seed=args.seed)
    model_info = {k: v for k, v in results.get("config", {}).items()
                  if k in ("ckpt", "tokenizer", "exit_layer", "skip_layers", "num_layers", "parameters")}
    report = _json_safe(build_report(results, tasks, model_info, limit))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(make_table(results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
