"""The ``lightning`` form: one ``.ckpt`` file written by ``torch.save`` (single device,
DDP). The module's weights lie under ``state_dict`` with the prefix ``model.``; the
ModelConfig, as a plain dict, under ``checkpoint["layerdrop"]["model_config"]``.

The file is a zip archive whose central directory comes last, so a file that opens as
an archive was written to the end; it is read by weights-only rules and memory-mapped
(framework/checkpoint/safety.py), so only the model's tensors are ever read. An opened
checkpoint (``open``) loads it once: that load is the proof that it runs no code, and
its metadata, shapes and tensors are then taken from it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from framework.checkpoint.base import MODEL_PREFIX, archive_reason, copy_into, metadata_of, training_model_config
from framework.checkpoint.safety import load_torch_file, prove_checkpoint_harmless


class LightningFile:
    name = "lightning"
    described = "a .ckpt file"
    self_contained = False

    def __init__(self, content: dict[str, Any] | None = None) -> None:
        self.content = content  # the file as ``open`` loaded it (None: not opened; each question loads it)

    def detect(self, path: Path) -> bool:
        return path.is_file()

    def incomplete_reason(self, path: Path) -> str | None:
        return archive_reason(path, named=False)

    def prove_harmless(self, path: Path) -> None:
        prove_checkpoint_harmless(path)

    def open(self, path: Path) -> LightningFile:
        return LightningFile(load_torch_file(path))  # weights-only: a file that loads runs no code

    def metadata(self, path: Path) -> dict[str, Any]:
        return metadata_of(self._loaded(path), path)

    def model_config(self, path: Path, metadata: dict[str, Any]) -> Any:
        return training_model_config(path, metadata)

    def shapes(self, path: Path) -> dict[str, tuple[int, ...]]:
        """Every model tensor's shape (the file is mapped: no tensor is read)."""
        return {name: tuple(tensor.shape) for name, tensor in self._model_tensors(path)}

    def tensors(self, path: Path, cfg: Any) -> list[tuple[str, Any]]:
        return self._model_tensors(path)

    def load_into(self, decoder: Any, path: Path) -> None:
        copy_into(decoder, self._model_tensors(path), path)

    def _loaded(self, path: Path) -> Any:
        return self.content if self.content is not None else load_torch_file(path)

    def _model_tensors(self, path: Path) -> list[tuple[str, Any]]:
        loaded = self._loaded(path)
        state = (loaded.get("state_dict") if isinstance(loaded, dict) else None) or {}
        return [(k[len(MODEL_PREFIX):], v) for k, v in state.items() if k.startswith(MODEL_PREFIX)]


__all__ = ["LightningFile"]
