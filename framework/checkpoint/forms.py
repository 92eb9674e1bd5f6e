"""The registry of checkpoint forms, in the order a path is matched against them.

A new form is one module implementing ``framework.checkpoint.base.Form`` and one entry
here; every command that reads a checkpoint (load, export, resume, find its tokenizer)
then knows it.
"""

from __future__ import annotations

import os
from pathlib import Path

from framework.checkpoint.base import CheckpointError, Form
from framework.checkpoint.sharded.dcp import DcpFolder
from framework.checkpoint.exported import ExportedFolder
from framework.checkpoint.hf.folder import HfFolder
from framework.checkpoint.lightning_file import LightningFile
from framework.checkpoint.sharded.zero import ZeroFolder

# A file is a Lightning checkpoint; a folder is a Hugging Face one if its config.json
# says so, an export if it holds the export's files, else a training folder of a
# sharded strategy.
FORMS: tuple[Form, ...] = (LightningFile(), HfFolder(), ExportedFolder(), DcpFolder(), ZeroFolder())
FORM_NAMES = tuple(form.name for form in FORMS)


def form_of(path: str | os.PathLike) -> Form:
    """The form of the file or folder at ``path`` (a one-line CheckpointError otherwise)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    for form in FORMS:
        if form.detect(path):
            return form
    described = [form.described for form in FORMS]
    raise CheckpointError(f"{str(path)!r} is not a checkpoint: expected {', '.join(described[:-1])} "
                          f"or {described[-1]}")


__all__ = ["FORMS", "FORM_NAMES", "form_of"]
