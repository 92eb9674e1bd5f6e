"""Test helper: what every optimizer step of a run did, appended to a JSON-lines file
(given to `layerdrop pretrain` through ``--trainer.callbacks``)."""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl


class RecordSteps(pl.Callback):
    """{"step", "loss", "groups": {name: [lr, weight_decay]}} per optimizer step. The
    learning rates are read after the scheduler stepped: those of the next step."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        groups = {g["name"]: [g["lr"], g["weight_decay"]] for g in trainer.optimizers[0].param_groups}
        with open(self.path, "a") as handle:
            handle.write(json.dumps({"step": trainer.global_step - 1, "loss": float(loss), "groups": groups}) + "\n")


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def callbacks_arg(path: Path) -> str:
    """The ``--trainer.callbacks`` value that records into ``path``."""
    return json.dumps([{"class_path": "tests.helpers.step_records.RecordSteps", "init_args": {"path": str(path)}}])
