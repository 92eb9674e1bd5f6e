"""Reading an FSDP2 checkpoint folder (torch.distributed.checkpoint) in one process:
the ``dcp`` form's loader (framework/checkpoint/sharded/dcp.py). Its own module because
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

``read_training_checkpoint`` reads the whole folder instead (model, optimizer, the
non-tensor entries of ``meta.pt``) as the checkpoint dict a single-file checkpoint
holds: an FSDP2/HSDP run resumed by one process (``--trainer.strategy single``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

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
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = SafeFileSystemReader(path)
    container, entries = model_entries(reader.read_metadata(), path)
    targets = decoder.state_dict()
    check_names(path, [n for n in targets if n not in entries], [n for n in entries if n not in targets])
    for name, entry in entries.items():
        check_shape(path, name, entry.size if isinstance(entry, TensorStorageMetadata) else "not a tensor",
                    targets[name].shape)
    state = {container: {MODEL_PREFIX + name: tensor for name, tensor in targets.items()}}
    _load(state, reader, DefaultLoadPlanner(allow_partial_load=True), path)


def read_training_checkpoint(path: Path, entries: dict[str, Any]) -> dict[str, Any]:
    """The DCP folder ``path`` whole, in this process, as Lightning's single-file form:
    ``entries`` (those of ``meta.pt``), ``state_dict`` (full model tensors) and ``optimizer_states``
    (each optimizer's state keyed by parameter name, its groups' ``params`` the names in
    the optimizer's own order, which is what ``Optimizer.load_state_dict`` matches by
    position). Memory: the whole checkpoint (model and optimizer state, unsharded)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = SafeFileSystemReader(path)
    metadata = reader.read_metadata()
    container, _ = model_entries(metadata, path)
    # DCP stores a flat {dotted key: value}; each key's place in the nested dict that
    # was saved is ``planner_data`` (torch's own DCP -> torch.save conversion reads it too).
    places = metadata.planner_data or {}
    flat = {key: torch.empty(entry.size, dtype=entry.properties.dtype) if isinstance(entry, TensorStorageMetadata)
            else None for key, entry in metadata.state_dict_metadata.items()}
    _load(flat, reader, WeightsOnlyPlanner(flatten_state_dict=False, flatten_sharded_tensors=False), path)
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        _place(nested, tuple(places.get(key, (key,))), value)
    checkpoint = dict(entries)
    checkpoint["state_dict"] = nested.pop(container)
    count = sum(1 for key in nested if key.startswith("optimizer_"))
    checkpoint["optimizer_states"] = [nested[f"optimizer_{index}"] for index in range(count)]
    return checkpoint


def _load(state: dict[str, Any], reader: Any, planner: Any, path: Path) -> None:
    """``dcp.load`` in this process; a missing or truncated shard file is one line."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with warnings.catch_warnings():  # "torch.distributed is disabled ...": one process is the point
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(state, storage_reader=reader, planner=planner, no_dist=True)
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as err:  # CheckpointException is a BaseException
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__  # DCP's last line
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: {reason}") from None


def _place(root: dict[str, Any], path: tuple, value: Any) -> None:
    """``root[path[0]][path[1]]... = value``, making the dicts (lists at int keys) on the way."""
    node: Any = root
    for key, following in zip(path[:-1], path[1:]):
        if isinstance(node, list):
            node.extend([None] * (key + 1 - len(node)))
            if node[key] is None:
                node[key] = [] if isinstance(following, int) else {}
            node = node[key]
        else:
            node = node.setdefault(key, [] if isinstance(following, int) else {})
    if isinstance(node, list):
        node.extend([None] * (path[-1] + 1 - len(node)))
    node[path[-1]] = value


class WeightsOnlyPlanner(DefaultLoadPlanner):
    """DCP's planner, reading the byte entries (optimizer hyper-parameters) by
    weights-only rules: DefaultLoadPlanner unpickles them with weights_only=False."""

    def load_bytes(self, read_item: Any, value: Any) -> None:
        self.state_dict[read_item.dest_index.fqn] = torch.load(value, map_location="cpu", weights_only=True)


__all__ = ["SafeFileSystemReader", "load_into", "model_entries", "stored_shapes", "read_training_checkpoint"]
