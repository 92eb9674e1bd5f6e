"""Reading the pickled files of a checkpoint without letting them run code.

A pickle is a small program: its GLOBAL and REDUCE instructions import and call any
function it names, so a checkpoint handed over by someone else could run anything
the moment a library unpickles it. Every checkpoint form has such files:

    single .ckpt (Lightning)    the whole file (torch.save: a zip holding data.pkl)
    FSDP2 folder (DCP)          .metadata (a plain pickle: torch's FileSystemReader
                                unpickles it with ``pickle.load``), meta.pt (Lightning's
                                non-tensor entries), and the byte entries inside the
                                ``*.distcp`` files (each one a torch.save'd object that
                                DCP's DefaultLoadPlanner loads with weights_only=False)
    DeepSpeed folder            every ``*_states.pt`` (DeepSpeed loads them with
                                weights_only=False)

They are read here by torch's weights-only rules: tensors, plain containers, and an
allow-list of exactly the library metadata classes those files hold (measured on
torch 2.13's DCP and deepspeed 0.19.8's ZeRO-2/3 state files), nothing else:

- torch.save files go through torch's own weights-only unpickler (``torch.load(...,
  weights_only=True)``), with the DeepSpeed classes allow-listed *by name* and mapped
  to inert stand-ins: no DeepSpeed code runs, and DeepSpeed need not be installed;
- DCP's ``.metadata`` is a protocol-4 pickle, which torch's weights-only unpickler
  cannot parse (it knows the protocol-2 opcodes of torch.save only), so it is read by
  ``RestrictedUnpickler``: Python's own unpickler with torch's rules applied (only
  allow-listed globals; only allow-listed callables and classes may be called, built
  or have their state set; no persistent ids, no extension registry).

The loaders of framework.checkpoint read every file through these functions, so
there is no gap between a check and a use. ``prove_checkpoint_harmless`` is for the
places where a library reads the files itself (Lightning's resume, DeepSpeed's
loader): it unpickles every pickled file of a checkpoint this way first and raises
CheckpointError naming the first file that would run code.
"""

from __future__ import annotations

import _compat_pickle
import codecs
import io
import os
import pathlib
import pickle
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from framework.checkpoint.base import CheckpointError

DCP_METADATA_FILE = ".metadata"
TORCH_FILE_SUFFIXES = (".pt", ".ckpt", ".pth", ".bin")


class LibraryObject:
    """Stands in for a library class that a checkpoint names: keeps the state the
    pickle gives it and runs none of the library's code."""

    def __init__(self, *args: Any) -> None:
        self.args = args

    @property
    def value(self) -> Any:  # an Enum member pickles as Enum(value)
        return self.args[0] if self.args else None


# What DeepSpeed 0.19.8 pickles into its ZeRO-2/3 state files besides tensors and
# plain containers (the loss scaler, the stage enum, ZeRO-2's parameter slice
# addresses); DynamicLossScaler is what fp16 runs keep instead of LossScaler.
DEEPSPEED_CLASSES = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
)
_STAND_INS = [(type(name.rsplit(".", 1)[1], (LibraryObject,), {}), name) for name in DEEPSPEED_CLASSES]


def _dcp_metadata_globals() -> dict[str, Any]:
    """Everything a DCP ``.metadata`` pickle may name: torch's metadata dataclasses,
    torch.Size, dtypes and layouts, and the path its StorageMeta records."""
    from torch.distributed.checkpoint import filesystem, metadata

    classes = [metadata.Metadata, metadata.TensorStorageMetadata, metadata.BytesStorageMetadata,
               metadata.ChunkStorageMetadata, metadata.TensorProperties, metadata.MetadataIndex,
               metadata.StorageMeta, metadata._MEM_FORMAT_ENCODING, filesystem._StorageInfo,
               torch.Size, torch.serialization._get_layout, OrderedDict, pathlib.PosixPath, pathlib.PurePosixPath]
    allowed = {f"{c.__module__}.{c.__qualname__}": c for c in classes}
    allowed.update({str(dtype): dtype for dtype in vars(torch).values() if isinstance(dtype, torch.dtype)})
    return allowed


# What torch's weights-only unpickler allows for plain values (older protocols name
# sets and bytes through these).
PLAIN_GLOBALS = {"builtins.set": set, "builtins.frozenset": frozenset, "builtins.bytearray": bytearray,
                 "builtins.complex": complex, "_codecs.encode": codecs.encode, "collections.OrderedDict": OrderedDict}


class RestrictedUnpickler(pickle._Unpickler):
    """Python's pure-Python unpickler (``pickle._Unpickler``: the C one cannot be told
    which objects REDUCE and BUILD may touch) with torch's weights-only rules."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, file: Any, allowed: dict[str, Any]) -> None:
        super().__init__(file)
        self.allowed = {**PLAIN_GLOBALS, **allowed}
        self._allowed_ids = {id(obj) for obj in self.allowed.values()}

    def find_class(self, module: str, name: str) -> Any:
        if self.proto < 3 and (module, name) in _compat_pickle.NAME_MAPPING:  # Python 2 names
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif self.proto < 3:
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        full_name = f"{module}.{name}"
        if full_name not in self.allowed:
            raise pickle.UnpicklingError(f"it names {full_name}, which is not allowed")
        return self.allowed[full_name]

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it holds a persistent id, which is not allowed")

    def _check(self, obj: Any, action: str) -> None:
        if id(obj) not in self._allowed_ids:
            raise pickle.UnpicklingError(f"it would {action} {obj!r}, which is not allowed")

    def load_reduce(self) -> None:  # stack: ..., callable, args
        self._check(self.stack[-2], "call")
        super().load_reduce()

    def load_newobj(self) -> None:  # stack: ..., class, args
        self._check(self.stack[-2], "create")
        super().load_newobj()

    def load_newobj_ex(self) -> None:  # stack: ..., class, args, kwargs
        self._check(self.stack[-3], "create")
        super().load_newobj_ex()

    def load_build(self) -> None:  # stack: ..., instance, state
        self._check(type(self.stack[-2]), "set the state of an instance of")
        super().load_build()

    def _refuse(self) -> None:
        raise pickle.UnpicklingError("it uses an opcode that can call arbitrary code (INST/OBJ/EXT)")

    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex
    dispatch[pickle.BUILD[0]] = load_build
    for _opcode in (pickle.INST, pickle.OBJ, pickle.EXT1, pickle.EXT2, pickle.EXT4):
        dispatch[_opcode[0]] = _refuse
    del _opcode


# ------------------------------------------------------------------ reading, safely


def _refusal(path: Path, err: BaseException) -> CheckpointError:
    """One line naming the file and what in it was refused. torch's message is a
    screen whose first paragraph advises ``weights_only=False`` (never ours to give:
    that is what would run the code); the reason is the paragraph naming the GLOBAL."""
    text = str(err).strip()
    named = re.search(r"GLOBAL ([\w.]+)", text)
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text.split("WeightsUnpickler error:", 1)[-1]) if p.strip()]
    reasons = [p for p in paragraphs if not _is_advice(p)]
    detail = reasons[0].splitlines()[0].split(". Please")[0].strip() if reasons else type(err).__name__
    if named:
        detail = f"it names {named.group(1)}, which is not allowed"
    elif detail.startswith("Unsupported operand"):
        return CheckpointError(f"checkpoint file {str(path)!r} is refused: it is not a pickle torch.save writes "
                               f"({detail}: damaged, or written by another program)")
    return CheckpointError(f"checkpoint file {str(path)!r} is refused: unpickling it could run code ({detail}); "
                           "a checkpoint may hold only tensors, plain values and its library's metadata")


def _is_advice(paragraph: str) -> bool:
    """torch's advice around the reason: to load with weights_only=False, or to read its docs."""
    return "weights_only" in paragraph or paragraph.startswith("Check the documentation")


def _is_unpickling_refusal(err: BaseException) -> bool:
    return isinstance(err, pickle.UnpicklingError) or "Weights only load failed" in str(err)


def load_torch_file(path: str | os.PathLike, *, deepspeed: bool = False, mmap: bool = True) -> Any:
    """``torch.load`` a torch.save file by weights-only rules, memory-mapped unless
    ``mmap=False`` (tensors are then read only when touched). ``deepspeed``: also allow
    DeepSpeed's state classes (as inert stand-ins)."""
    path = Path(path)
    return _torch_load(path, path, deepspeed=deepspeed, mmap=mmap)


def _torch_load(source: Any, name: Path, *, deepspeed: bool, mmap: bool = True) -> Any:
    extra = _STAND_INS if deepspeed else []
    try:
        with torch.serialization.safe_globals(extra):
            try:
                return torch.load(source, map_location="cpu", weights_only=True,
                                  mmap=mmap and isinstance(source, Path))
            except RuntimeError as err:
                if "mmap" not in str(err):  # an old (non-zip) torch.save file cannot be mapped
                    raise
                return torch.load(source, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError, EOFError, zip errors...
        if _is_unpickling_refusal(err):
            raise _refusal(name, err) from None
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"checkpoint file {str(name)!r} cannot be read: {reason}") from None


def load_dcp_metadata(path: str | os.PathLike) -> Any:
    """A DCP ``.metadata`` file, unpickled by ``RestrictedUnpickler``."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            metadata = RestrictedUnpickler(handle, _dcp_metadata_globals()).load()
    except (pickle.UnpicklingError, TypeError, AttributeError) as err:
        raise _refusal(path, err) from None
    except Exception as err:  # truncated or not a pickle at all
        raise CheckpointError(f"checkpoint file {str(path)!r} cannot be read: "
                              f"{str(err).strip() or type(err).__name__}") from None
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"checkpoint file {str(path)!r} is not torch.distributed.checkpoint metadata")
    return metadata


# ------------------------------------------------------------------ the proof


def prove_checkpoint_harmless(path: str | os.PathLike) -> None:
    """Unpickle every pickled file of the checkpoint at ``path`` (any form) by the
    rules above; raise CheckpointError naming the first one that could run code.

    A folder is walked whole (symbolic links followed): every torch.save file
    (``*.pt``, ``*.ckpt``, ``*.pth``, ``*.bin``; DeepSpeed's classes are allowed in its
    ``*_states.pt`` only), every DCP ``*.metadata`` file and the byte entries of the
    ``*.distcp`` files it points to, which must lie inside the checkpoint. A DeepSpeed
    ``latest`` tag must name a folder inside the checkpoint (DeepSpeed joins it to the path).
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    if path.is_file():
        _torch_load(path.resolve(), path, deepspeed=False)
        return
    seen: set[str] = set()
    for folder, names in _walk(path, seen):
        if "latest" in names:
            _check_deepspeed_tag(folder)
        for name in sorted(names):
            file = folder / name
            if name.endswith(DCP_METADATA_FILE):
                _prove_dcp_byte_entries(folder, load_dcp_metadata(file))
            elif name.endswith(TORCH_FILE_SUFFIXES):  # DeepSpeed's classes only in DeepSpeed's state files
                _torch_load(file.resolve(), file, deepspeed=name.endswith("_states.pt"))


def _walk(root: Path, seen: set[str]):
    """(folder, file names) of ``root`` and every folder below it, links followed once."""
    real = os.path.realpath(root)
    if real in seen:
        return
    seen.add(real)
    files, folders = [], []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        (folders if entry.is_dir() else files).append(entry.name)
    yield root, files
    for name in folders:
        yield from _walk(root / name, seen)


def _check_deepspeed_tag(folder: Path) -> None:
    tag = (folder / "latest").read_text(errors="replace").strip()
    if not re.fullmatch(r"[\w.\-]+", tag) or tag in (".", ".."):
        raise CheckpointError(f"checkpoint file {str(folder / 'latest')!r} is refused: its tag {tag[:80]!r} is not "
                              "the name of a folder inside the checkpoint")


def _prove_dcp_byte_entries(folder: Path, metadata: Any) -> None:
    """The non-tensor values of a DCP checkpoint (optimizer hyper-parameters, ...)
    are torch.save'd into the .distcp files; DCP loads them with weights_only=False."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    byte_keys = {key for key, entry in metadata.state_dict_metadata.items() if isinstance(entry, BytesStorageMetadata)}
    handles: dict[str, Any] = {}
    try:
        for index, info in (metadata.storage_data or {}).items():
            if getattr(index, "fqn", None) not in byte_keys:
                continue
            file = folder / info.relative_path
            if not file.resolve().is_relative_to(folder.resolve()):
                raise CheckpointError(f"checkpoint file {str(folder / DCP_METADATA_FILE)!r} is refused: entry "
                                      f"{index.fqn!r} lies in {info.relative_path!r}, outside the checkpoint")
            if info.transform_descriptors:
                raise CheckpointError(f"checkpoint file {str(file)!r}: entry {index.fqn!r} is stored with "
                                      f"transforms {list(info.transform_descriptors)}, which cannot be checked")
            if str(file) not in handles:
                handles[str(file)] = open(file, "rb")
            handle = handles[str(file)]
            handle.seek(info.offset)
            entry = io.BytesIO(handle.read(info.length))
            _torch_load(entry, Path(f"{file}[{index.fqn}]"), deepspeed=False)
    except OSError as err:
        raise CheckpointError(f"checkpoint {str(folder)!r} cannot be read: {err}") from None
    finally:
        for handle in handles.values():
            handle.close()


__all__ = ["prove_checkpoint_harmless", "load_torch_file", "load_dcp_metadata", "RestrictedUnpickler",
           "LibraryObject", "DEEPSPEED_CLASSES"]
