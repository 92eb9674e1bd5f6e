"""The self-speculative draft of a Hugging Face export: `layerdrop export --format hf
--draft-from SEARCH_REPORT` writes the exit draft that `layerdrop speculate search`
measured fastest (its report's ``best_exit``) into generation_config.json, so that
``AutoModelForCausalLM.from_pretrained(DIR).generate(ids)`` drafts with the model's own
first K layers and verifies with all of them (transformers' LayerSkip decoding,
``assistant_early_exit``), the output token-identical to plain greedy decoding.

transformers runs the draft by cutting the base model's layer loop at K
(``config.num_hidden_layers``), then the final norm and the unembedding: exactly
layerdrop's exit draft at K (blocks 0..K-1). The draft length is the searched γ, fixed
(``num_assistant_tokens``, schedule "constant"), and the confidence cut that would stop a
draft early is off (``assistant_confidence_threshold`` 0), so transformers drafts as the
search measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from framework.checkpoint.base import CheckpointError, first_line
from framework.files.nesting import json_document


def read_search_report(report_path: str | Path, error: type[Exception] = CheckpointError) -> tuple[Any, str]:
    """The parsed JSON of a `layerdrop speculate search` report (any JSON value: the caller
    checks its entries) and the ``--draft-from`` phrase messages name it by; ``error`` (one
    line) for a path that does not exist or is not readable JSON."""
    where = f"--draft-from {str(report_path)!r}"
    path = Path(report_path)
    if not path.is_file():
        raise error(f"{where} does not exist (a report of `layerdrop speculate search --out FILE`)")
    try:
        return json_document(path.read_text(), where), where
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise error(f"{where} is not a readable JSON report ({first_line(err)})") from None


def check_searched_depth(report: dict, num_layers: int, where: str, error: type[Exception] = CheckpointError) -> None:
    """``error`` (one line) unless the report was searched on a model of ``num_layers`` blocks."""
    if report.get("num_layers") != num_layers:
        raise error(f"{where} was searched on a model of {report.get('num_layers')!r} layers, this one has "
                    f"{num_layers}: search this model's draft")


def draft_generation_entries(report_path: str | Path, num_layers: int) -> dict[str, Any]:
    """generation_config.json's entries for the search report at ``report_path`` of a model
    of ``num_layers`` blocks; CheckpointError (one line) for a report that is not one, or
    that another depth of model made."""
    report, where = read_search_report(report_path)
    best = report.get("best_exit") if isinstance(report, dict) else None
    if not isinstance(best, dict):
        raise CheckpointError(f"{where} has no best_exit: not a report of `layerdrop speculate search` (or one "
                              "made before it decoded exit drafts: run the search again)")
    check_searched_depth(report, num_layers, where)
    exit_layer, gamma = best.get("exit_layer"), report.get("gamma")
    if not _is_int(exit_layer) or not 1 <= exit_layer <= num_layers - 1:
        raise CheckpointError(f"{where}: best_exit.exit_layer={exit_layer!r} is invalid: an exit in 1..{num_layers - 1}")
    if not _is_int(gamma) or gamma < 1:
        raise CheckpointError(f"{where}: gamma={gamma!r} is invalid: draft tokens per round, an integer >= 1")
    if best.get("identical_to_greedy") is not True:
        raise CheckpointError(f"{where}: its exit draft {exit_layer} was not lossless when measured "
                              "(identical_to_greedy is not true)")
    return {"assistant_early_exit": exit_layer, "num_assistant_tokens": gamma,
            "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


__all__ = ["draft_generation_entries", "read_search_report", "check_searched_depth"]
