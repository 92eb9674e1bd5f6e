"""The report of `layerdrop eval downstream`: lm-eval's results, each task's summary metric,
and which documents each task scored."""

from __future__ import annotations

import math
from typing import Sequence

# The metric a summary row shows for a task, first present wins.
_PRIMARY_METRICS = ("acc_norm,none", "acc,none", "exact_match,get-answer", "exact_match,strict-match",
                    "exact_match,flexible-extract", "exact_match,none", "word_perplexity,none")


def primary_metric(metrics: dict) -> tuple[str, float] | None:
    for key in _PRIMARY_METRICS:
        if isinstance(metrics.get(key), (int, float)):
            return key, float(metrics[key])
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and "stderr" not in key and key != "samples":
            return key, float(value)
    return None


def build_report(results: dict, tasks: Sequence[str], model_info: dict, limit: float | None,
                 data: dict | None = None, not_run: dict | None = None) -> dict:
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
            "limit": limit, "lm_eval_version": getattr(lm_eval, "__version__", None),
            "data": _scored_counts(data or {}, results.get("n-samples", {})), "not_run": dict(not_run or {})}


def _scored_counts(data: dict, samples: dict) -> dict:
    """Each task's data record with the documents scored (fewer under --limit)."""
    return {task: {**record, "scored": samples.get(task, {}).get("effective", record.get("documents"))}
            for task, record in data.items()}


def json_safe(value):
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "item"):  # numpy / torch scalars
        return json_safe(value.item())
    return str(value)


__all__ = ["primary_metric", "build_report", "json_safe"]
