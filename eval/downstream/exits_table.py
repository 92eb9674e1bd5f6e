"""`layerdrop eval downstream --exit-layers all [--sets ...] [--adapters DIR]`: the suite at
every exit, skip set and adapter exit in one run.

The model loads once. Log-likelihood requests are scored at every plain exit and every
adapter exit from one forward (the blocks run once up to the deepest exit; each exit's
state goes through the final norm and head, through its adapter block first for an
adapter exit: eval/downstream/lm_eval_adapter.ExitScores). A skip set cannot share that
forward — the blocks above a skipped one see another residual stream — so each skip set
runs one forward of its own over the requests. lm-eval then computes each column's
metrics from its own numbers, exactly as ``--exit-layer K``, ``--exit-layer K --adapters
DIR`` or ``--skip-layers S`` would alone. Generation tasks (none in the packaged suite)
decode once per column. The result is Table A.3's form with the columns (exits, adapter
exits, skip sets) side by side, and a plot of each task's metric against the blocks run.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Sequence

MODEL_KEYS = ("ckpt", "tokenizer", "num_layers", "parameters")


def columns_of(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """Plain exits, then adapter exits, then skip sets, as ``LayerDropLM.use_column`` names them."""
    return ([("exit", k) for k in args.exits] + [("adapter", k) for k in args.adapter_exits or []]
            + [("skip", tuple(s)) for s in args.skip_sets or []])


def column_key(column: tuple[str, Any]) -> str:
    """The column's key in the report: ``K`` (plain exit), ``adapter:K``, ``skip:i,j`` (``skip:none``)."""
    kind, value = column
    if kind == "exit":
        return str(value)
    if kind == "adapter":
        return f"adapter:{value}"
    return "skip:" + (",".join(map(str, value)) or "none")


def evaluate_exits(args: argparse.Namespace, model_args: dict, task_objects: list, tasks: Sequence[str],
                   evaluate_kwargs: dict, data: dict, not_run: dict) -> dict:
    """{column key: lm-eval results} for every column (``columns_of(args)``), one model,
    shared forwards, and the report (``table``: task -> column key -> the task's summary
    metric)."""
    import lm_eval

    from eval.downstream.lm_eval_adapter import LayerDropLM
    from eval.downstream.lm_eval_noise import quiet_lm_eval
    from eval.downstream.report import build_report
    from eval.skip_sets import describe, params_kept

    lm = LayerDropLM(**model_args, batch_size=args.batch_size, device=args.device)
    adapters = None
    if args.adapter_exits:
        from eval.adapters.exit_adapters import load_adapters

        adapters, _ = load_adapters(args.adapters, lm.decoder)
    lm.share_exits(args.exits, skip_sets=args.skip_sets or [], adapters=adapters,
                   adapter_exits=args.adapter_exits or [])
    by_column = {}
    for column in columns_of(args):
        lm.use_column(column)
        with quiet_lm_eval():
            by_column[column_key(column)] = lm_eval.simple_evaluate(model=lm, tasks=task_objects, **evaluate_kwargs)
    reports = {key: build_report(results, tasks, {}, evaluate_kwargs.get("limit"), data, not_run)
               for key, results in by_column.items()}
    table: dict[str, dict[str, float]] = {}
    metric: dict[str, str] = {}
    for key, report in reports.items():
        for task, row in report["summary"].items():
            table.setdefault(task, {})[key] = row["value"]
            metric[task] = row["metric"]
    last = reports[key]
    n = lm.model_cfg.n_layers
    scores = lm.exit_scores
    return {"by_exit": by_column,
            "report": {"model": {key: value for key, value in lm.get_model_info().items() if key in MODEL_KEYS},
                       "tasks": list(tasks), "exits": list(args.exits),
                       "adapter_exits": list(args.adapter_exits or []),
                       "adapters": str(args.adapters) if args.adapter_exits else None,
                       "skip_sets": {column_key(("skip", s)): {"skip_layers": list(s), "name": describe(s, n),
                                                                "params_kept": params_kept(lm.decoder, s)}
                                     for s in args.skip_sets or []},
                       "columns": list(by_column), "metric": metric, "table": table,
                       "pairs_scored": scores.pairs_scored, "skip_pairs_scored": scores.skip_pairs_scored,
                       "limit": last["limit"], "data": last["data"], "not_run": last["not_run"],
                       "lm_eval_version": last["lm_eval_version"],
                       "results_by_exit": {key: {part: report[part] for part in ("summary", "results", "n-samples")}
                                           for key, report in reports.items()}}}


def heading(key: str, report: dict) -> str:
    """A column's title in the printed table: ``exit K``, ``adapter K``, ``skip <set>``."""
    if key.startswith("adapter:"):
        return f"adapter {key.split(':', 1)[1]}"
    if key.startswith("skip:"):
        return f"skip {report['skip_sets'][key]['name']}"
    return f"exit {key}"


def table_text(report: dict) -> str:
    """Tasks as rows, columns as in the report (Table A.3 with the depth as a dimension)."""
    keys = report.get("columns") or [str(k) for k in report["exits"]]
    rows = [["task", "metric", *(heading(key, report) for key in keys)]]
    for task, values in report["table"].items():
        rows.append([task, report["metric"][task].split(",")[0],
                     *(f"{values[key]:.4f}" if key in values else "-" for key in keys)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def plot_accuracy(report: dict, path: str | Path) -> Path:
    """Each task's summary metric against the blocks run: a line over the plain exits,
    a dashed one over the adapter exits, a cross per skip set at L - |S| (named)."""
    from eval.measurements.plots import colours, exits_figure, save_figure

    tasks = list(report["table"])
    labels = {task: f"{task} ({report['metric'][task].split(',')[0]})" for task in tasks}
    colour_of = colours([labels[task] for task in tasks])
    series = []
    for task in tasks:
        values = report["table"][task]
        plain = {key: value for key, value in values.items() if key.isdigit()}
        adapted = {key.split(":", 1)[1]: value for key, value in values.items() if key.startswith("adapter:")}
        if plain or not adapted:
            series.append({"label": labels[task], "exit_loss": plain})
        if adapted:
            colour_of[labels[task] + " + adapters"] = colour_of[labels[task]]
            series.append({"label": labels[task] + " + adapters", "exit_loss": adapted, "linestyle": "--"})
    figure = exits_figure(series, title="Downstream accuracy by exit", colour_of=colour_of)
    axes = figure.axes[0]
    num_layers = report["model"]["num_layers"]
    for task in tasks:
        for key, skip in report.get("skip_sets", {}).items():
            if key in report["table"][task]:
                x, y = num_layers - len(skip["skip_layers"]), report["table"][task][key]
                axes.scatter([x], [y], marker="x", color=colour_of[labels[task]], zorder=3)
                axes.annotate(f"skip {skip['name']}", (x, y), fontsize=6, textcoords="offset points", xytext=(3, 3))
    axes.set_xlabel("blocks run (exit layer; a skip set at L minus its size)")
    axes.set_ylabel("accuracy (the task's summary metric)")
    return save_figure(figure, path)


__all__ = ["columns_of", "column_key", "evaluate_exits", "heading", "table_text", "plot_accuracy"]
