"""The ``hf`` form: a Hugging Face folder, ``config.json`` + ``model.safetensors`` (or shards
named by ``model.safetensors.index.json``) + ``tokenizer.json``, as
``save_pretrained`` writes one (of any family with a transformers class).

Read: only safetensors (memory-mapped, one tensor at a time). A folder that holds
only pickled ``pytorch_model.bin`` weights is refused in one line, never unpickled.
The config and the names go through the Hugging Face mapping of the family that reads
the config's ``model_type`` (framework/families/<name>/hf.py), which refuses anything it
cannot represent exactly. Shard files named by the index must lie inside
the folder.

Write (``layerdrop export --format hf``): model.safetensors, config.json,
generation_config.json, and the tokenizer (tokenizer.json + tokenizer_config.json)
when there is one; ``AutoModelForCausalLM.from_pretrained`` loads it.
"""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Iterator

import torch

from framework.files.atomic_write import copy_file, write_text
from framework.checkpoint.base import (CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE, CheckpointError, copy_into,
                                       first_line, read_json)
from framework.checkpoint.shape_check import check_config_against
from framework.checkpoint.hf.tokens import GENERATION_CONFIG_FILE, TOKENIZER_CONFIG_FILE
from framework.checkpoint.tokenizer_record import TOKEN_ID_KEYS, check_token_ids
from framework.checkpoint.safetensors_writer import SafetensorsWriter
from framework.config import ModelConfig
from framework.families.family_spec import HFConfigError, HFMapping, shown
from framework.families.registry import family_spec, hf_families, hf_model_types
from framework.tokenizer import load_tokenizer, special_tokens

INDEX_FILE = "model.safetensors.index.json"
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
# Hugging Face buffers some old checkpoints carry: recomputed here, never read.
_BUFFERS = ("rotary_emb.inv_freq",)


class HfFolder:
    name = "hf"
    described = "a Hugging Face folder (config.json with model_type + safetensors)"
    self_contained = True  # config, weights and tokenizer inside the folder (an HF config has no record)

    def detect(self, path: Path) -> bool:
        return is_hf_folder(path)

    def incomplete_reason(self, path: Path) -> str | None:
        try:
            weight_files(path)
        except CheckpointError as err:
            return str(err)
        return None

    def prove_harmless(self, path: Path) -> None:
        weight_files(path)  # safetensors only: nothing is unpickled (a pickle-only folder is refused)

    def open(self, path: Path) -> HfFolder:
        self.prove_harmless(path)
        return self

    def metadata(self, path: Path) -> dict[str, Any]:
        return read_json(path / CONFIG_FILE)

    def model_config(self, path: Path, metadata: dict[str, Any]) -> ModelConfig:
        return checked_config(path, metadata)

    def shapes(self, path: Path) -> None:
        return None  # checked_config compares the config with the safetensors headers

    def tensors(self, path: Path, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
        return read_tensors(path, cfg)

    def load_into(self, decoder: Any, path: Path) -> None:
        copy_into(decoder, read_tensors(path, decoder.config), path)


def is_hf_folder(path: str | os.PathLike) -> bool:
    """A folder whose config.json is a Hugging Face model config (it has ``model_type``
    or ``architectures``; layerdrop's own export has a ``model`` section instead)."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        return False
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError, RecursionError):  # not JSON (the export's reader says so in one line)
        return False
    return isinstance(config, dict) and "model" not in config and ("model_type" in config or "architectures" in config)


def checked_config(path: Path, hf: dict[str, Any]) -> ModelConfig:
    """The folder's ModelConfig, checked against its safetensors headers before anything
    is built: every name and shape the config implies (the same one-line refusal the
    project's own checkpoints get), float dtypes only. Nothing but the headers is read."""
    if not isinstance(hf, dict):
        raise CheckpointError(f"{str(path / CONFIG_FILE)!r} is not a JSON object")
    cfg = config_of(hf, str(path / CONFIG_FILE))
    check_token_ids(hf, str(path / CONFIG_FILE))  # copied into every export
    stored = {name: shape for name, shape in header_shapes(path).items() if not name.endswith(_BUFFERS)}
    check_config_against(cfg, _writer(cfg).our_shapes(stored, cfg), path)
    return cfg


def header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Hugging Face name -> shape, from the safetensors headers of the folder (no tensor
    is read); a tensor of a non-float dtype is refused (it would be cast silently)."""
    from safetensors import safe_open

    shapes = {}
    for file in weight_files(path):
        try:
            with safe_open(str(file), framework="pt") as handle:
                for name in handle.keys():
                    piece = handle.get_slice(name)
                    if piece.get_dtype() not in FLOAT_DTYPES:
                        raise CheckpointError(f"{str(file)!r}: {shown(name)} is {piece.get_dtype()}: layerdrop reads "
                                              f"float weights only ({', '.join(FLOAT_DTYPES)}); a quantized or "
                                              "integer checkpoint is not supported")
                    shapes[name] = tuple(piece.get_shape())
        except CheckpointError:
            raise
        except Exception as err:
            raise CheckpointError(f"{str(path)!r}: a safetensors file cannot be read: "
                                  f"{first_line(err)}") from None
    return shapes


def mapping_of(hf: dict[str, Any], source: str) -> HFMapping:
    """The Hugging Face mapping of the family that reads this config's ``model_type``."""
    families = hf_model_types()
    model_type = hf.get("model_type")
    if model_type is None:  # an old config without one: its architecture says it
        model_type = next((t for t, spec in families.items() if hf.get("architectures") == [spec.hf.architecture]), None)
    if not isinstance(model_type, str) or model_type not in families:
        raise CheckpointError(f"{source}: model_type={shown(model_type)} is not supported: allowed: "
                              + ", ".join(repr(t) for t in families))
    return families[model_type].hf


def config_of(hf: dict[str, Any], source: str) -> ModelConfig:
    """The ModelConfig of a Hugging Face config.json (CheckpointError, one line, if refused)."""
    try:
        return mapping_of(hf, source).config_from_hf(hf, source=source)
    except HFConfigError as err:
        raise CheckpointError(str(err)) from None


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of the folder (the shards its index names, in order)."""
    if (path / INDEX_FILE).is_file():
        index = str(path / INDEX_FILE)
        weight_map = _weight_map(path / INDEX_FILE)
        files = []
        for name in dict.fromkeys(weight_map.values()):
            file = (path / name).resolve()
            if not _inside_model(path, name, file):
                raise CheckpointError(f"{index!r} names the shard {shown(name)} outside the folder")
            if not file.is_file():
                raise CheckpointError(f"{index!r} names the shard {shown(name)}, which does not exist")
            files.append(file)
        return files
    if (path / WEIGHTS_FILE).is_file():
        return [path / WEIGHTS_FILE]
    pickled = [name for name in PICKLED_WEIGHTS if (path / name).exists()]
    if pickled:
        raise CheckpointError(f"{str(path)!r} holds only pickled weights ({pickled[0]}): layerdrop reads safetensors "
                     "only and never unpickles a model; convert it where you trust it, e.g. "
                     "from_pretrained(...).save_pretrained(dir, safe_serialization=True)")
    raise CheckpointError(f"{str(path)!r} has a Hugging Face config.json but no {WEIGHTS_FILE} or {INDEX_FILE}")


def _weight_map(index: Path) -> dict[str, str]:
    """The index's weight_map, {tensor name: shard file name}; one line naming the key otherwise."""
    try:
        content = json.loads(index.read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise CheckpointError(f"{str(index)!r} is not JSON: {first_line(err)}") from None
    weight_map = content.get("weight_map") if isinstance(content, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{str(index)!r} is not a safetensors index: weight_map={shown(weight_map)}, "
                              "allowed: an object {tensor name: shard file}")
    for key, value in weight_map.items():
        if not isinstance(value, str):
            raise CheckpointError(f"{str(index)!r}: weight_map[{shown(key)}]={shown(value)} is invalid: allowed: "
                                  "a shard file name")
    return weight_map


def _inside_model(folder: Path, name: str, file: Path) -> bool:
    """A shard named by the index is the folder's own: it lies inside the folder, or is a
    link from inside it into the blob store of the model's own Hugging Face cache tree
    (``models--org--name/snapshots/<revision>/`` -> ``models--org--name/blobs/``)."""
    root = folder.resolve()
    named = Path(os.path.normpath(folder.absolute() / name))
    if root in file.parents:
        return True
    blobs = root.parent.parent / "blobs"
    return (root.parent.name == "snapshots" and named.parent == folder.absolute() and (folder / name).is_symlink()
            and blobs in file.parents)


def read_tensors(path: str | os.PathLike, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """The decoder's (name, tensor) pairs from the folder's safetensors; names that
    the family does not have are refused (they would be silently dropped)."""
    from safetensors import safe_open

    path = Path(path)
    with ExitStack() as stack:
        where: dict[str, Any] = {}
        try:
            for file in weight_files(path):
                handle = stack.enter_context(safe_open(str(file), framework="pt"))
                where.update({name: handle for name in handle.keys()})
        except Exception as err:
            if isinstance(err, CheckpointError):
                raise
            raise CheckpointError(f"{str(path)!r}: a safetensors file cannot be read: "
                         f"{str(err).strip().splitlines()[0]}") from None
        mapping = _writer(cfg)
        expected = mapping.hf_names(cfg)
        unknown = sorted(n for n in where if n not in expected and not n.endswith(_BUFFERS))
        if unknown:
            raise CheckpointError(f"{str(path)!r} holds tensors a {cfg.family} decoder of this config does not have "
                         f"({len(unknown)}, the first {unknown[0]!r})")
        missing = sorted(expected - set(where))
        if missing:
            raise CheckpointError(f"{str(path)!r} does not match its config.json: missing {missing[:5]}")
        yield from mapping.from_hf(lambda name: where[name].get_tensor(name), cfg)


# ------------------------------------------------------------------ writing


def write_hf_folder(decoder: torch.nn.Module, out_dir: str | os.PathLike, *, tokenizer: str | os.PathLike | None = None,
                    ids: dict[str, Any] | None = None, generation: dict[str, Any] | None = None,
                    tokenizer_config: dict[str, Any] | None = None, overwrite: bool = False) -> Path:
    """Write ``decoder`` (one process, unsharded, a family with a transformers class) as a
    Hugging Face folder. ``ids``: config.json's bos/eos/pad_token_id; ``generation``:
    generation_config.json's entries (default ``ids``; a draft's too: draft.py);
    ``tokenizer_config``: tokenizer_config.json's special tokens and entries (tokens.py;
    default: the tokens of ``ids``' bos and first eos)."""
    out_dir = Path(out_dir)
    ids = {key: value for key, value in (ids or {}).items() if key in TOKEN_ID_KEYS}
    config = hf_config_of(decoder.config, bos_id=ids.get("bos_token_id"), eos_id=ids.get("eos_token_id"))
    if ids.get("pad_token_id") is not None:
        config["pad_token_id"] = ids["pad_token_id"]
    if (out_dir / WEIGHTS_FILE).exists() and not overwrite:
        raise CheckpointError(f"{str(out_dir)!r} already holds {WEIGHTS_FILE}; pass --overwrite to replace it")
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = list(_writer(decoder.config).to_hf(decoder.state_dict(), decoder.config))
    with SafetensorsWriter(out_dir / WEIGHTS_FILE, [(n, t.dtype, tuple(t.shape)) for n, t in tensors]) as writer:
        for name, tensor in tensors:
            writer.write(name, tensor)
    (out_dir / INDEX_FILE).unlink(missing_ok=True)  # an earlier sharded export's, now stale
    write_text(out_dir / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    generation = {**(ids if generation is None else generation), "do_sample": False}
    write_text(out_dir / GENERATION_CONFIG_FILE, json.dumps(generation, indent=2) + "\n")
    if tokenizer is not None:
        copy_file(Path(tokenizer), out_dir / TOKENIZER_FILE)
        entries = tokenizer_config if tokenizer_config is not None else _special_tokens(
            Path(tokenizer), ids.get("eos_token_id"), ids.get("bos_token_id"))
        written = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": decoder.config.max_seq_len,
                   **entries}
        write_text(out_dir / TOKENIZER_CONFIG_FILE, json.dumps(written, indent=2) + "\n")
    return out_dir


def hf_config_of(cfg: ModelConfig, *, bos_id: int | None = None, eos_id: int | list[int] | None = None) -> dict[str, Any]:
    """The config.json of ``cfg`` as its family's transformers class; CheckpointError (one
    line) for a family without one or a config it cannot hold (before any weight is read)."""
    try:
        return _writer(cfg).config_to_hf(cfg, bos_id=bos_id, eos_id=eos_id)
    except HFConfigError as err:
        raise CheckpointError(str(err)) from None


def _writer(cfg: ModelConfig) -> HFMapping:
    mapping = family_spec(cfg.family).hf
    if mapping is None:
        raise CheckpointError(f"family={cfg.family!r} has no transformers class; --format hf needs family: "
                              + ", ".join(hf_families()))
    return mapping


def _special_tokens(tokenizer: Path, eos_id: int | list[int] | None, bos_id: int | None) -> dict[str, str]:
    """The eos/bos token strings of the ids (an eos_token_id list: its first), for
    transformers' tokenizer_config.json."""
    return special_tokens(load_tokenizer(tokenizer, "tokenizer"), eos_token=eos_id, bos_token=bos_id)


__all__ = ["HfFolder", "is_hf_folder", "read_tensors", "weight_files", "write_hf_folder",
           "hf_config_of", "config_of", "mapping_of",
           "INDEX_FILE", "PICKLED_WEIGHTS"]
