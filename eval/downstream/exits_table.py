"""`layerdrop eval downstream --exit-layers all`: the suite at every exit in one run.

The model loads once; log-likelihood requests are scored at every exit from one forward
(the blocks run once up to the deepest exit, each exit's state goes through the final
norm and head: eval/downstream/lm_eval_adapter.ExitScores), and lm-eval then computes
each exit's metrics from its own numbers, exactly as ``--exit-layer K`` would. Generation
tasks (none in the packaged suite) decode once per exit. The result is Table A.3's form
with exits as columns, and a plot of each task's metric against the exit.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

MODEL_KEYS = ("ckpt", "tokenizer", "num_layers", "parameters")


def evaluate_exits(args: argparse.Namespace, model_args: dict, task_objects: list, tasks: Sequence[str],
                   evaluate_kwargs: dict, data: dict, not_run: dict) -> dict:
    """{exit: lm-eval results} for every exit in ``args.exits``, one model, shared forwards,
    and the report (``table``: task -> exit -> the task's summary metric)."""
    import lm_eval

    from eval.downstream.report import build_report
    from eval.downstream.lm_eval_adapter import LayerDropLM

    lm = LayerDropLM(**model_args, batch_size=args.batch_size, device=args.device)
    lm.share_exits(args.exits)
    by_exit = {}
    for exit_layer in args.exits:
        lm.use_exit(exit_layer)
        by_exit[exit_layer] = lm_eval.simple_evaluate(model=lm, tasks=task_objects, **evaluate_kwargs)
    reports = {k: build_report(results, tasks, {}, evaluate_kwargs.get("limit"), data, not_run)
               for k, results in by_exit.items()}
    table: dict[str, dict[str, float]] = {}
    metric: dict[str, str] = {}
    for k, report in reports.items():
        for task, row in report["summary"].items():
            table.setdefault(task, {})[str(k)] = row["value"]
            metric[task] = row["metric"]
    last = reports[args.exits[-1]]
    return {"by_exit": by_exit,
            "report": {"model": {key: value for key, value in lm.get_model_info().items() if key in MODEL_KEYS},
                       "tasks": list(tasks), "exits": list(args.exits), "metric": metric, "table": table,
                       "pairs_scored": lm.exit_scores.pairs_scored, "limit": last["limit"], "data": last["data"],
                       "not_run": last["not_run"], "lm_eval_version": last["lm_eval_version"],
                       "results_by_exit": {str(k): {key: report[key] for key in ("summary", "results", "n-samples")}
                                           for k, report in reports.items()}}}


def table_text(report: dict) -> str:
    """Tasks as rows, exits as columns (Table A.3 with the depth as a dimension)."""
    exits = [str(k) for k in report["exits"]]
    rows = [["task", "metric", *(f"exit {k}" for k in exits)]]
    for task, values in report["table"].items():
        rows.append([task, report["metric"][task].split(",")[0],
                     *(f"{values[k]:.4f}" if k in values else "-" for k in exits)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def plot_accuracy(report: dict, path: str | Path) -> Path:
    """Each task's summary metric against the exit layer (one line per task)."""
    from eval.measurements.plots import exits_figure, save_figure

    series = [{"label": f"{task} ({report['metric'][task].split(',')[0]})", "exit_loss": values}
              for task, values in report["table"].items()]
    figure = exits_figure(series, title="Downstream accuracy by exit")
    figure.axes[0].set_ylabel("accuracy (the task's summary metric)")
    return save_figure(figure, path)


__all__ = ["evaluate_exits", "table_text", "plot_accuracy"]
