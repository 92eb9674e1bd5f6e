"""The exported form of a decoder: ``model.safetensors`` + ``config.json`` (+ ``tokenizer.json``).

    layerdrop export --ckpt runs/x/checkpoints/last.ckpt --out exports/x
    layerdrop export --ckpt runs/x/checkpoints/step-00001000.ckpt --out exports/x-1000 --no-tokenizer
    layerdrop export --ckpt runs/llama/export --out hf/llama --format hf    # LlamaForCausalLM

``--format hf`` writes a Hugging Face folder (framework/hf_checkpoint.py) that
transformers loads as ``LlamaForCausalLM``; only the Llama family has one.

``--ckpt`` takes every form framework.checkpoint reads (a .ckpt file, an FSDP2 or
DeepSpeed folder, an export). The tokenizer is found as framework.checkpoint_tokenizer
says; when none is found the export stops with one line naming where it looked
(``--tokenizer FILE`` names one, ``--no-tokenizer`` exports the weights without it).

At the end of every pretraining run ``FinalExport`` writes this form to
``<default_root_dir>/export/``: every rank gathers one tensor at a time (as the
strategy's registry entry gathers it, framework/strategies), global rank 0 streams it
to disk.
Post-training and eval of a large run then need neither the sharded checkpoints nor
the training world size.

config.json::

    {"model": {ModelConfig}, "training": {"global_step", "layer_dropout", "parametrization"},
     "tokenizer": {"file": "tokenizer.json", "sha256", "vocab_size", "eos_token", "eos_id"}}

safetensors files are written here by a small streaming writer (``SafetensorsWriter``)
because the safetensors library writes only from a complete in-memory dict (and
copies every tensor to bytes first): that would hold an 8.2B model twice on rank 0.
The format is the library's (an 8-byte little-endian header length, a JSON header of
names, dtypes, shapes and byte offsets, then the raw little-endian data); files are
read back with the library.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info

from framework.checkpoint import CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE, CheckpointError, checkpoint_form
from framework.checkpoint_tokenizer import KeepTokenizer
from framework.command_parser import CommandParser
from framework.model import Decoder
from framework.output_path import folder_problem
from framework.strategies import entry_of

EXPORT_FOLDER = "export"
_DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                torch.bool: "BOOL"}


class SafetensorsWriter:
    """Writes a safetensors file one tensor at a time, in the order of ``specs``
    ((name, dtype, shape) known up front); the file appears under its name only when
    complete (written to a hidden partial file, fsynced, renamed)."""

    def __init__(self, path: str | os.PathLike, specs: list[tuple[str, torch.dtype, tuple[int, ...]]]) -> None:
        self.path = Path(path)
        self.partial = self.path.with_name(f".{self.path.name}.partial")
        self.specs = list(specs)
        self._next = 0
        self._handle: Any = None

    def __enter__(self) -> SafetensorsWriter:
        header, offset = {}, 0
        for name, dtype, shape in self.specs:
            if dtype not in _DTYPE_NAMES:
                raise CheckpointError(f"{name}: dtype {dtype} cannot be written to safetensors")
            size = _numel(shape) * torch.empty((), dtype=dtype).element_size()
            header[name] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        header["__metadata__"] = {"format": "pt"}
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as the library writes it
        self._handle = open(self.partial, "wb")
        self._handle.write(struct.pack("<Q", len(encoded)) + encoded)
        return self

    def write(self, name: str, tensor: torch.Tensor) -> None:
        expected, dtype, shape = self.specs[self._next]
        if name != expected or tensor.dtype != dtype or tuple(tensor.shape) != tuple(shape):
            raise CheckpointError(f"safetensors writer: got {name} {tensor.dtype} {list(tensor.shape)}, "
                                  f"expected {expected} {dtype} {list(shape)}")
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        self._handle.write(memoryview(data.view(torch.uint8).numpy()))
        self._next += 1

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        self._handle.close()
        if kind is None and self._next != len(self.specs):
            kind = CheckpointError
            error = CheckpointError(f"safetensors writer: {len(self.specs) - self._next} tensors were not written")
        if kind is not None:
            self.partial.unlink(missing_ok=True)
            if isinstance(error, CheckpointError):
                raise error
            return
        _fsync(self.partial)
        os.replace(self.partial, self.path)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= int(size)
    return count


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def write_text(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def copy_file(source: Path, target: Path) -> None:
    partial = target.with_name(f".{target.name}.partial")
    shutil.copyfile(source, partial)
    os.replace(partial, target)


def export_decoder(decoder: Decoder, out_dir: str | os.PathLike, *, extra: dict | None = None,
                   overwrite: bool = False, tokenizer: str | os.PathLike | None = None) -> Path:
    """Write ``decoder`` (one process, unsharded) as an exported folder; refuses to
    replace an export unless ``overwrite``. ``tokenizer``: a tokenizer.json to copy in."""
    out_dir = Path(out_dir)
    if (out_dir / WEIGHTS_FILE).exists() and not overwrite:
        raise CheckpointError(f"{str(out_dir)!r} already holds {WEIGHTS_FILE}; pass --overwrite to replace it")
    out_dir.mkdir(parents=True, exist_ok=True)
    state = decoder.state_dict()
    with SafetensorsWriter(out_dir / WEIGHTS_FILE, [(k, v.dtype, tuple(v.shape)) for k, v in state.items()]) as writer:
        for name, tensor in state.items():
            writer.write(name, tensor)
    config = {"model": decoder.config.to_dict(), **(extra or {})}
    if tokenizer is not None:
        copy_file(Path(tokenizer), out_dir / TOKENIZER_FILE)
        config.setdefault("tokenizer", {"file": TOKENIZER_FILE})
    else:
        (out_dir / TOKENIZER_FILE).unlink(missing_ok=True)  # an earlier export's, now stale
        config.pop("tokenizer", None)
    write_text(out_dir / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
    return out_dir


def training_record(path: Path) -> dict[str, Any]:
    """What config.json keeps of the training run that wrote the checkpoint ``path``."""
    from framework.checkpoint import CKPT_KEY, read_metadata

    metadata = read_metadata(path)
    if checkpoint_form(path) == "exported":
        return {k: v for k, v in metadata.items() if k != "model"}
    if checkpoint_form(path) == "hf":  # what an HF config says of its tokens
        return {k: metadata[k] for k in ("bos_token_id", "eos_token_id") if metadata.get(k) is not None}
    entry = metadata.get(CKPT_KEY) or {}
    record: dict[str, Any] = {"training": {"global_step": metadata.get("global_step"),
                                           **{k: entry[k] for k in ("layer_dropout", "parametrization") if k in entry}}}
    if isinstance(entry.get("tokenizer"), dict):
        record["tokenizer"] = dict(entry["tokenizer"])
    return record


# ------------------------------------------------------------------ layerdrop export


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(
        prog="layerdrop export",
        description="Write a checkpoint of any form (.ckpt, FSDP2 or DeepSpeed folder, export) as "
                    "model.safetensors + config.json + tokenizer.json.",
        epilog="Example: layerdrop export --ckpt runs/tiny/checkpoints/last.ckpt --out exports/tiny")
    parser.add_argument("--ckpt", required=True, help="a checkpoint written by layerdrop pretrain (any strategy), "
                                                      "or an exported folder")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an export already in --out")
    parser.add_argument("--format", choices=("layerdrop", "hf"), default="layerdrop",
                        help="layerdrop: model.safetensors + config.json (every family); hf: a Hugging Face "
                             "LlamaForCausalLM folder (family llama)")
    tokenizer = parser.add_mutually_exclusive_group()
    tokenizer.add_argument("--tokenizer", default=None, help="the tokenizer.json to include (default: the run's)")
    tokenizer.add_argument("--no-tokenizer", action="store_true", help="export the weights without a tokenizer")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    out, source = Path(args.out), Path(args.ckpt)
    try:
        if (problem := folder_problem(out)) is not None:  # before loading anything
            raise CheckpointError(f"--out {problem}")
        if (out / WEIGHTS_FILE).exists() and not args.overwrite:
            raise CheckpointError(f"{str(out)!r} already holds {WEIGHTS_FILE}; pass --overwrite to replace it")
        from framework.checkpoint import load_decoder, read_model_config

        if args.format == "hf":
            from framework.families.llama_hf import HFConfigError, to_hf_config

            try:  # a Celerity model is refused before any weight is read
                to_hf_config(read_model_config(source))
            except HFConfigError as err:
                raise CheckpointError(str(err)) from None
        tokenizer_file = _tokenizer_for(args, source)
        decoder, _ = load_decoder(source)
        record = training_record(source)
        if args.format == "hf":
            return _export_hf(args, decoder, record, tokenizer_file)
        if tokenizer_file is not None:
            from framework.checkpoint_tokenizer import sha256_of

            record["tokenizer"] = {**record.get("tokenizer", {}), "file": TOKENIZER_FILE,
                                   "sha256": sha256_of(tokenizer_file)}
        export_decoder(decoder, out, extra=record, overwrite=args.overwrite, tokenizer=tokenizer_file)
    except CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"exported {args.ckpt} -> {out}/{WEIGHTS_FILE} + {CONFIG_FILE}"
          + (f" + {TOKENIZER_FILE}" if tokenizer_file is not None else " (no tokenizer: --no-tokenizer)"))
    return 0


def _export_hf(args: argparse.Namespace, decoder: Decoder, record: dict[str, Any], tokenizer: Path | None) -> int:
    from framework.hf_checkpoint import write_hf_folder

    source_config = record.get("tokenizer") or {}
    eos_id = source_config.get("eos_id", record.get("eos_token_id"))
    write_hf_folder(decoder, args.out, tokenizer=tokenizer, eos_id=eos_id, bos_id=record.get("bos_token_id"),
                    overwrite=args.overwrite)
    print(f"exported {args.ckpt} -> {args.out} (Hugging Face LlamaForCausalLM: model.safetensors, config.json, "
          "generation_config.json" + (", tokenizer.json" if tokenizer is not None else "; no tokenizer") + ")")
    return 0


def _tokenizer_for(args: argparse.Namespace, source: Path) -> Path | None:
    if args.no_tokenizer:
        return None
    if args.tokenizer is not None:
        if not Path(args.tokenizer).is_file():
            raise CheckpointError(f"--tokenizer {args.tokenizer!r} does not exist")
        return Path(args.tokenizer)
    from framework.checkpoint import find_tokenizer

    try:
        return find_tokenizer(source)
    except CheckpointError as err:
        raise CheckpointError(f"{err}; pass --tokenizer FILE, or --no-tokenizer to export the weights alone") from None


# ------------------------------------------------------------------ at the end of a run


class FinalExport(pl.Callback):
    """At the end of training, writes the model as an exported folder to
    ``<default_root_dir>/export/`` (replacing a previous one only once the new one is
    complete). Every rank gathers each tensor in turn; global rank 0 writes it.
    Weights that are not finite are not exported (the run says so in one line)."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        root = str(trainer.default_root_dir)
        if "://" in root:
            rank_zero_info(f"final export skipped: {root} is not a local folder (run `layerdrop export` later)")
            return
        started = (time.perf_counter(), time.process_time())
        out = Path(root) / EXPORT_FOLDER
        staging = out.with_name(f".{EXPORT_FOLDER}.staging")
        tensors = pl_module.model.state_dict(keep_vars=True)
        strategy = entry_of(trainer.strategy)
        specs = [(name, strategy.export_dtype(t), strategy.full_shape(t)) for name, t in tensors.items()]
        writer, non_finite, failed = None, [], None
        if trainer.is_global_zero:
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            writer = SafetensorsWriter(staging / WEIGHTS_FILE, specs).__enter__()
        for name, tensor in tensors.items():
            full = strategy.full_tensor(tensor)  # a collective: every rank, in the same order
            if writer is None:
                continue
            try:  # a failed write must not stop rank 0 from taking part in the next gather
                full = full.detach().to("cpu", strategy.export_dtype(tensor))
                if full.is_floating_point() and not bool(torch.isfinite(full).all()):
                    non_finite.append(name)
                writer.write(name, full)
            except (OSError, CheckpointError) as err:
                writer.__exit__(type(err), None, None)
                writer, failed = None, err
        if writer is not None:
            writer.__exit__(None, None, None)
            self._finish(trainer, pl_module, staging, out, non_finite,
                         time.perf_counter() - started[0], time.process_time() - started[1])
        elif failed is not None:
            shutil.rmtree(staging, ignore_errors=True)
            print(f"final export failed: {failed}", file=sys.stderr, flush=True)
        trainer.strategy.barrier("final_export")

    def _finish(self, trainer: pl.Trainer, pl_module: pl.LightningModule, staging: Path, out: Path,
                non_finite: list[str], seconds: float, cpu_seconds: float) -> None:
        if non_finite:
            shutil.rmtree(staging, ignore_errors=True)
            print(f"final export skipped: {len(non_finite)} tensors are not finite (the first {non_finite[0]})",
                  file=sys.stderr, flush=True)
            return
        config = {"model": pl_module.model_cfg.to_dict(),
                  "training": {"global_step": trainer.global_step, "layer_dropout": asdict(pl_module.dropout_cfg),
                               "parametrization": asdict(pl_module.param_cfg)}}
        keeper = next((cb for cb in trainer.callbacks if isinstance(cb, KeepTokenizer)), None)
        kept = getattr(keeper, "kept", None) or (Path(keeper.source) if keeper and keeper.source else None)
        if kept is not None and kept.is_file():
            copy_file(kept, staging / TOKENIZER_FILE)
            config["tokenizer"] = dict(keeper.record)
        else:
            print("final export: no tokenizer found for the run's data; the export holds the weights alone",
                  file=sys.stderr, flush=True)
        write_text(staging / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
        replaced = out.with_name(f".{EXPORT_FOLDER}.replaced")
        shutil.rmtree(replaced, ignore_errors=True)
        if out.exists():
            os.rename(out, replaced)
        os.rename(staging, out)
        shutil.rmtree(replaced, ignore_errors=True)
        rank_zero_info(f"exported the final model to {out} (model.safetensors + config.json"
                       + (" + tokenizer.json)" if "tokenizer" in config else ")")
                       + f" in {seconds:.2f} s, {cpu_seconds:.2f} CPU s on rank 0")


def export_callbacks() -> list[pl.Callback]:
    """What `layerdrop pretrain` adds to every run: the tokenizer kept beside the
    checkpoints (and recorded in them), and the export at the end."""
    return [KeepTokenizer(), FinalExport()]


__all__ = ["SafetensorsWriter", "export_decoder", "training_record", "main", "FinalExport", "export_callbacks", "EXPORT_FOLDER"]
