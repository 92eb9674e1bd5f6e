"""The ``exported`` form: a folder of ``model.safetensors`` + ``config.json`` (+
``tokenizer.json``), written by ``layerdrop export`` and at the end of every run
(framework/checkpoint/export.py).

Nothing in it is a pickle. ``config.json`` is a file someone may have edited, so the
shapes it implies are checked against the safetensors header (names and shapes; the
library checks the byte offsets) before a model is built: a config asking for 10^5
blocks or a 10^7-wide model is refused in one line instead of allocating.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from framework.checkpoint.base import (CONFIG_FILE, WEIGHTS_FILE, CheckpointError, copy_into, first_line,
                                       model_config_from, read_json)
from framework.checkpoint.safety import prove_checkpoint_harmless


class ExportedFolder:
    name = "exported"
    described = f"an exported folder ({WEIGHTS_FILE} + {CONFIG_FILE})"
    self_contained = True  # config, weights and tokenizer all inside the folder

    def detect(self, path: Path) -> bool:
        return path.is_dir() and ((path / WEIGHTS_FILE).is_file() or (path / CONFIG_FILE).is_file())

    def incomplete_reason(self, path: Path) -> str | None:
        missing = [name for name in (WEIGHTS_FILE, CONFIG_FILE) if not (path / name).is_file()]
        return f"no {' and no '.join(missing)}" if missing else None

    def prove_harmless(self, path: Path) -> None:
        prove_checkpoint_harmless(path)  # a stray .pt someone put beside the weights

    def open(self, path: Path) -> ExportedFolder:
        self.prove_harmless(path)
        return self

    def metadata(self, path: Path) -> dict[str, Any]:
        return read_json(path / CONFIG_FILE)

    def model_config(self, path: Path, metadata: dict[str, Any]) -> Any:
        if not isinstance(metadata.get("model"), dict):
            raise CheckpointError(f"{str(path)!r}: config has no 'model' section")
        return model_config_from(metadata["model"], path)

    def shapes(self, path: Path) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape from the safetensors header (no tensor is read)."""
        with _opened(path) as handle:
            return {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}

    def tensors(self, path: Path, cfg: Any) -> Iterator[tuple[str, torch.Tensor]]:
        return _tensors(path)

    def load_into(self, decoder: Any, path: Path) -> None:
        copy_into(decoder, _tensors(path), path)


class _opened:
    """safetensors' memory-mapped reader, its errors turned into CheckpointError."""

    def __init__(self, path: Path) -> None:
        self.file = path / WEIGHTS_FILE

    def __enter__(self) -> Any:
        from safetensors import safe_open

        if not self.file.is_file():
            raise CheckpointError(f"exported model folder {str(self.file.parent)!r} has no {WEIGHTS_FILE}")
        try:
            self.handle = safe_open(str(self.file), framework="pt")
            return self.handle.__enter__()
        except Exception as err:  # safetensors raises its own error types on a corrupt file
            raise CheckpointError(f"{str(self.file)!r} cannot be read: {first_line(err)}") from None

    def __exit__(self, *exc: Any) -> None:
        self.handle.__exit__(*exc)


def _tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    with _opened(path) as handle:
        for name in handle.keys():
            try:
                tensor = handle.get_tensor(name)
            except Exception as err:  # a header that promises more than the file holds
                raise CheckpointError(f"{str(path / WEIGHTS_FILE)!r} cannot be read: {first_line(err)}") from None
            yield name, tensor


__all__ = ["ExportedFolder"]
