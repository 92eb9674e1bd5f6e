"""Reading an FSDP2 checkpoint folder (torch.distributed.checkpoint) in one process:
the ``dcp`` form's loader (framework/checkpoint/dcp.py). Its own module because
importing torch.distributed.checkpoint costs seconds (it pulls in DTensor and dynamo):
only a command that reads such a folder pays for it.

Lightning's ModelParallelStrategy saves ``{"state_dict": {...}, "optimizer_0": {...}}``
through DCP: every rank writes its shards to ``__<rank>_0.distcp``, rank 0 writes the
global ``.metadata`` (which chunk of which tensor lies where) and ``meta.pt`` (the
checkpoint's non-tensor entries). Lightning's FSDPStrategy (FSDP1, sharded) writes the
same with ``"model"`` in place of ``"state_dict"``.

DCP itself reassembles the chunks: ``dcp.load`` without a process group (``no_dist``)
reads each model tensor's chunks straight into the decoder's own tensors, so memory
is the decoder plus one chunk. Only the model's entries are requested
(``allow_partial_load``); the optimizer's tensors and byte entries are never read.
``.metadata`` is unpickled by framework/checkpoint/safety.py's restricted unpickler
instead of torch's ``pickle.load``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemReader

from framework.checkpoint.base import MODEL_PREFIX, CheckpointError, check_names, check_shape
from framework.checkpoint.safety import DCP_METADATA_FILE, load_dcp_metadata

CONTAINERS = ("state_dict", "model")  # ModelParallelStrategy, FSDPStrategy


class SafeFileSystemReader(FileSystemReader):
    """torch's FileSystemReader, reading ``.metadata`` by weights-only rules."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        rank = kwargs.get("rank")
        name = DCP_METADATA_FILE if rank is None else f"__{rank}{DCP_METADATA_FILE}"
        metadata = load_dcp_metadata(Path(self.path) / name)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id  # as FileSystemReader does
        return metadata


def model_entries(metadata: Any, path: Path) -> tuple[str, dict[str, Any]]:
    """(container, {decoder tensor name: its TensorStorageMetadata}) of a DCP checkpoint."""
    for container in CONTAINERS:
        prefix = f"{container}.{MODEL_PREFIX}"
        entries = {key[len(prefix):]: entry for key, entry in metadata.state_dict_metadata.items()
                   if key.startswith(prefix)}
        if entries:
            return container, entries
    raise CheckpointError(f"checkpoint {str(path)!r} holds no model weights (no "
                          f"{' or '.join(repr(c + '.' + MODEL_PREFIX) for c in CONTAINERS)} entries in .metadata)")


def stored_shapes(path: Path) -> dict[str, Any]:
    """{decoder tensor name: its shape} from .metadata (no shard is read)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    _, entries = model_entries(load_dcp_metadata(path / DCP_METADATA_FILE), path)
    return {name: tuple(entry.size) if isinstance(entry, TensorStorageMetadata) else "not a tensor"
            for name, entry in entries.items()}


def load_into(decoder: Any, path: Path) -> None:
    """Fill ``decoder``'s tensors from the DCP folder ``path`` (any world size)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = SafeFileSystemReader(path)
    container, entries = model_entries(reader.read_metadata(), path)
    targets = decoder.state_dict()
    check_names(path, [n for n in targets if n not in entries], [n for n in entries if n not in targets])
    for name, entry in entries.items():
        check_shape(path, name, entry.size if isinstance(entry, TensorStorageMetadata) else "not a tensor",
                    targets[name].shape)
    state = {container: {MODEL_PREFIX + name: tensor for name, tensor in targets.items()}}
    try:
        dcp.load(state, storage_reader=reader, planner=DefaultLoadPlanner(allow_partial_load=True), no_dist=True)
    except CheckpointError:
        raise
    except Exception as err:  # a missing or truncated shard file
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__  # DCP's last line
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: {reason}") from None


__all__ = ["SafeFileSystemReader", "load_into", "model_entries", "stored_shapes"]
