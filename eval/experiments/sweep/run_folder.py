"""One run's folder inside a sweep folder (its files and its state), and the command its
stages run. Shared by the local sweep (eval/experiments/sweep/runner.py) and the SLURM array
it can write instead (eval/experiments/sweep/slurm.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eval.experiments.sweep.spec import EvalSpec, Run


class RunFolder:
    """Paths and state of one run inside the sweep folder."""

    def __init__(self, root: Path, run: Run) -> None:
        self.run, self.dir = run, root / "runs" / run.name

    recipe = property(lambda self: self.dir / "recipe.yaml")
    config = property(lambda self: self.dir / "config.yaml")
    summary = property(lambda self: self.dir / "summary.json")
    status_file = property(lambda self: self.dir / "status.json")
    checkpoint = property(lambda self: self.dir / "checkpoints" / "last.ckpt")

    def eval_out(self, spec: EvalSpec) -> Path:
        return self.dir / "evals" / f"{spec.name}.json"

    def log(self, stage: str) -> Path:
        return self.dir / "logs" / f"{stage}.log"

    def status(self) -> dict:
        return json.loads(self.status_file.read_text()) if self.status_file.is_file() else {}

    def state(self, evals: list[EvalSpec]) -> str:
        """done | trained (evaluations missing) | partial (a checkpoint, no summary) | failed | pending."""
        if self.summary.is_file():
            missing = [s for s in evals if s.applies_to(self.run.name) and not self.eval_out(s).exists()]
            if not missing:
                return "done"
            return "failed" if self.status().get("state") == "failed" else "trained"
        if self.status().get("state") == "failed":
            return "failed"
        return "partial" if self.checkpoint.exists() else "pending"


def layerdrop() -> list[str]:
    """This interpreter's `layerdrop` (the sweep's children use the same install)."""
    return [sys.executable, "-m", "framework.cli"]
