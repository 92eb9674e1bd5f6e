"""The ``dcp`` form: an FSDP2 checkpoint folder written by Lightning's
ModelParallelStrategy through torch.distributed.checkpoint (``.metadata``, the
``__R_0.distcp`` shards, ``meta.pt`` holding the non-tensor entries); read in one
process by framework/checkpoint/sharded/dcp_reader.py.

A folder is complete when ``.metadata`` and ``meta.pt`` are there, ``meta.pt`` is a
whole archive and every shard file is as long as ``.metadata`` says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from framework.checkpoint.base import (CheckpointError, archive_reason, metadata_of, refuse_non_finite,
                                       training_model_config)
from framework.checkpoint.safety import (DCP_METADATA_FILE, load_dcp_metadata, load_torch_file,
                                         prove_checkpoint_harmless)

LIGHTNING_META = "meta.pt"  # ModelParallelStrategy's non-tensor entries beside the shards


class DcpFolder:
    name = "dcp"
    described = "an FSDP2 folder (.metadata + meta.pt)"
    self_contained = False

    def detect(self, path: Path) -> bool:
        return (path / DCP_METADATA_FILE).is_file() or (path / LIGHTNING_META).exists()

    def incomplete_reason(self, path: Path) -> str | None:
        for name in (DCP_METADATA_FILE, LIGHTNING_META):
            if not (path / name).is_file():
                return f"no {name}"
        return archive_reason(path / LIGHTNING_META) or _shards_missing(path)

    def prove_harmless(self, path: Path) -> None:
        prove_checkpoint_harmless(path)

    def open(self, path: Path) -> DcpFolder:
        self.prove_harmless(path)
        return self

    def metadata(self, path: Path) -> dict[str, Any]:
        meta = path / LIGHTNING_META
        return metadata_of(load_torch_file(meta) if meta.is_file() else None, path)

    def model_config(self, path: Path, metadata: dict[str, Any]) -> Any:
        return training_model_config(path, metadata)

    def shapes(self, path: Path) -> dict[str, Any]:
        from framework.checkpoint.sharded.dcp_reader import stored_shapes  # torch.distributed.checkpoint: seconds

        return stored_shapes(path)

    def load_into(self, decoder: Any, path: Path) -> None:
        from framework.checkpoint.sharded.dcp_reader import load_into

        load_into(decoder, path)
        refuse_non_finite(decoder, path)  # torch's reader filled it, not copy_into

    def training_checkpoint(self, path: Path) -> dict[str, Any]:
        """The whole folder as the dict a single-file checkpoint holds: an FSDP2/HSDP run
        resumed by one process (framework/training/checkpointing/saving.py's AtomicCheckpointIO)."""
        from framework.checkpoint.sharded.dcp_reader import read_training_checkpoint

        return read_training_checkpoint(path, load_torch_file(path / LIGHTNING_META, mmap=False))

    def tensors(self, path: Path, cfg: Any) -> Any:
        # torch's reader fills a model, it does not hand out tensors one at a time.
        raise CheckpointError(f"{str(path)!r} is an FSDP2 checkpoint folder: export it first "
                              "(layerdrop export --ckpt ... --out DIR) and start from DIR")


def _shards_missing(path: Path) -> str | None:
    """The shard files against the sizes .metadata gives them."""
    needed: dict[str, int] = {}
    for info in (load_dcp_metadata(path / DCP_METADATA_FILE).storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        shard = path / name
        have = shard.stat().st_size if shard.is_file() else 0
        if have < size:
            return f"shard {name} holds {have} of {size} bytes"
    return None


__all__ = ["DcpFolder", "LIGHTNING_META"]
