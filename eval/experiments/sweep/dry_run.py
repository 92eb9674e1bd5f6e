"""`layerdrop sweep --dry-run`: every run with its predicted P̄, length, FLOPs and state
(and each compute-matched configuration's FLOPs beside its targets'); writes nothing."""

from __future__ import annotations

from pathlib import Path

import yaml

from eval.experiments.sweep.compute_matched import COUNT_NAMES
from eval.experiments.sweep.run_folder import RunFolder
from eval.experiments.sweep.spec import Run, Sweep, format_flops, get_dotted, predict, run_recipe


def dry_run(sweep: Sweep, root: Path, runs: list[Run], flops_per_second: float | None,
            elsewhere: dict[str, Path] | None = None) -> int:
    """The runs with predicted P̄, FLOPs saved and compute, and their state; writes nothing."""
    rows, total = [], 0.0
    for run in runs:
        recipe = run_recipe(sweep, run, root / "runs" / run.name)
        prediction = predict(recipe)
        state = RunFolder(root, run).state(sweep.evals)
        if state != "done" and run.name in (elsewhere or {}):
            state = f"done in {elsewhere[run.name]} (adopted, not run)"
        else:
            total += prediction.training_flops
        rows.append((run.name, prediction, int(get_dotted(recipe, "trainer.max_steps")), state))
    width = max(len(name) for name, *_ in rows)
    print(f"{'run':<{width}}  {'P̄':>6}  {'total saved':>11}  {'steps':>7}  {'total FLOPs':>14}  {'tokens':>11}  "
          f"{'TPP':>5}  state")
    for name, p, steps, state in rows:
        print(f"{name:<{width}}  {p.mean_dropout:6.4f}  {p.flops_saved_pct:10.2f}%  {steps:>7,}  "
              f"{format_flops(p.training_flops):>14}  {p.tokens:>11,}  {p.tokens_per_parameter:5.1f}  {state}")
    line = f"{len(rows)} runs, predicted training compute {format_flops(total)} FLOPs"
    if flops_per_second:
        seconds = total / flops_per_second
        span = f"{seconds / 3600:.2f} hours" if seconds >= 3600 else f"{seconds / 60:.1f} minutes" \
            if seconds >= 60 else f"{seconds:.1f} seconds"
        line += f" = {span} at {format_flops(flops_per_second)} FLOP/s"
    print(line + f"; evaluations: {', '.join(s.name for s in sweep.evals) or 'none'}")
    print("P̄: predicted share of the blocks' (non-embedding: the paper's) training FLOPs saved; total saved: of "
          "the total training FLOPs (blocks, unembedding and early-exit heads) against a plain dense run, negative "
          "where the run costs more; TPP: tokens per non-embedding parameter")
    matched_lines(sweep, root, runs)
    return 0


def matched_lines(sweep: Sweep, root: Path, runs: list[Run]) -> None:
    """For each compute-matched configuration listed: its FLOPs beside its targets', both
    counts (non-embedding: the blocks; total: the unembedding and exit heads too)."""
    shown = {r.config_name: r for r in runs if r.matches}
    if not shown:
        return
    block = (yaml.safe_load(sweep.text) or {}).get("flops_matched")
    count = block.get("count", "non_embedding") if isinstance(block, dict) else "non_embedding"
    print("compute-matched (eval/experiments/sweep/compute_matched.py): FLOPs vs each target's, non-embedding / total "
          f"(matched on: {COUNT_NAMES.get(count, count)})")
    by_config = {r.config_name: r for r in sweep.runs}
    for name, run in shown.items():
        mine = predict(run_recipe(sweep, run, root / "runs" / run.name))
        targets = []
        for target in run.matches:
            theirs = predict(run_recipe(sweep, by_config[target], root / "runs" / by_config[target].name))
            targets.append(f"{target} {100 * (mine.non_embedding_flops / theirs.non_embedding_flops - 1):+.2f}% / "
                           f"{100 * (mine.training_flops / theirs.training_flops - 1):+.2f}%")
        print(f"  {name} ({format_flops(mine.non_embedding_flops)} / {format_flops(mine.training_flops)}): "
              + ", ".join(targets))


__all__ = ["dry_run", "matched_lines"]
