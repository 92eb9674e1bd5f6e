"""The exported form of a decoder: ``model.safetensors`` + ``config.json`` (+ ``tokenizer.json``).

    layerdrop export --ckpt runs/x/checkpoints/last.ckpt --out exports/x
    layerdrop export --ckpt runs/x/checkpoints/step-00001000.ckpt --out exports/x-1000 --no-tokenizer
    layerdrop export --ckpt runs/qwen/export --out hf/qwen --format hf    # Qwen2ForCausalLM

``--format hf`` writes a Hugging Face folder (framework/checkpoint/hf/folder.py) that
transformers loads as the family's class (its framework/families/<name>/hf.py); the
default Celerity family has none.

``--ckpt`` takes every form framework/checkpoint/forms.py lists (a .ckpt file, an FSDP2
or DeepSpeed folder, an export). The tokenizer is found as
framework/checkpoint/tokenizer_record.py says; when none is found the export stops with
one line naming where it looked (``--tokenizer FILE`` names one, ``--no-tokenizer``
exports the weights without it).

``--out`` is a new folder, an empty one, or an export (replaced only with
``--overwrite``); any other folder is refused, ``--overwrite`` or not: nothing but an
export is ever replaced. A replacement is written beside the old export and swapped in
with two renames; one interrupted between them is finished by the next export (or the
next run, for ``<run>/export``).

config.json::

    {"model": {ModelConfig}, "training": {"global_step", "layer_dropout", "parametrization"},
     "tokenizer": {"file": "tokenizer.json", "sha256", "vocab_size", "eos_token", "eos_id"}}
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from framework.files.atomic_write import copy_file, write_text
from framework.checkpoint.base import CKPT_KEY, CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE, CheckpointError
from framework.checkpoint.folder import finish_replacement, publish, remove_path, staging_path
from framework.checkpoint.hf.folder import hf_config_of, write_hf_folder
from framework.checkpoint.hf.draft import draft_generation_entries
from framework.checkpoint.hf.tokens import generation_ids, read_hf_tokens, tokenizer_entries
from framework.checkpoint.loader import Checkpoint
from framework.checkpoint.safetensors_writer import SafetensorsWriter
from framework.checkpoint.tokenizer_record import sha256_of
from framework.command_parser import CommandParser
from framework.files.output_path import folder_problem
from framework.files.run_lock import in_use
from framework.tokenizer import TokenizerError, load_tokenizer, vocab_size_of

EXPORT_FOLDER = "export"
EXPORT_FILES = (WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_FILE)


MARKER = ".layerdrop-export"  # written last into every export this project makes (both formats)


def is_export(folder: Path) -> bool:
    """An export this project wrote: its marker, or (an export from before the marker) a
    layerdrop config.json beside the weights and nothing else. A Hugging Face folder
    from elsewhere (``save_pretrained``) is not one, whatever its file names."""
    if (folder / MARKER).is_file():
        return True
    names = {entry.name for entry in folder.iterdir() if not entry.name.startswith(".")}
    if CONFIG_FILE not in names or not names <= set(EXPORT_FILES):
        return False
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("model"), dict) and "architectures" not in config


def export_target(out: str | os.PathLike) -> Path:
    """The folder an ``--out`` names, refused in one line when an export cannot own it
    (the current folder or one above it: an export replaces the folder it writes); a
    symbolic link is followed, so the folder it points at is replaced and the link kept."""
    given = Path(out)
    if given.name in ("", ".", "..") or Path.cwd().resolve().is_relative_to(given.resolve()):
        raise CheckpointError(f"--out {str(out)!r} is invalid: an export replaces the folder it writes, and this one "
                              "holds the current folder; name a new folder (e.g. --out exports/run)")
    if given.is_symlink():
        target = Path(os.path.realpath(given))
        if not target.exists():  # the export would make it, and every missing folder above it
            raise CheckpointError(f"--out {str(out)!r} is a link to {str(target)!r}, which does not exist: create "
                                  "that folder first, or give another --out")
        if not target.is_dir():
            raise CheckpointError(f"--out {str(out)!r} is a link to the file {str(target)!r}: give a folder")
        return target
    return given


def check_export_target(out: Path, overwrite: bool) -> None:
    """Refuse, before any work, an ``--out`` that the export would not only create or
    replace: a file, a folder that is not an export, an export without --overwrite.
    What a killed export left beside it is cleaned up first."""
    finish_replacement(out)
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise CheckpointError(f"--out {str(out)!r} is a file: give a new or empty folder")
    held = sorted(entry.name for entry in out.iterdir() if not entry.name.startswith("."))
    if not held:
        return
    if not is_export(out):
        shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
        raise CheckpointError(f"--out {str(out)!r} is a folder that is not an export (it holds {shown}; layerdrop "
                              "replaces only a folder it exported, --overwrite or not): give a new or empty folder")
    if not overwrite:
        raise CheckpointError(f"{str(out)!r} already holds {WEIGHTS_FILE if WEIGHTS_FILE in held else CONFIG_FILE}; "
                              "pass --overwrite to replace it")


def export_decoder(decoder: Any, out_dir: str | os.PathLike, *, extra: dict | None = None,
                   overwrite: bool = False, tokenizer: str | os.PathLike | None = None) -> Path:
    """Write ``decoder`` (one process, unsharded) as an exported folder; refuses to
    replace an export unless ``overwrite`` (and anything else always).
    ``tokenizer``: a tokenizer.json to copy in."""
    out = export_target(out_dir)
    check_export_target(out, overwrite)
    return write_staged(out, lambda folder: _write(decoder, folder, extra, tokenizer))


def write_staged(out: Path, write: Any) -> Path:
    """``write(folder)`` into a staging folder beside ``out``, marked as this project's,
    then swapped in with two renames: ``out`` is the old export or the new, never a mix."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_path(out)
    remove_path(staging)
    staging.mkdir()
    try:
        write(staging)
        mark_export(staging)
    except BaseException:
        remove_path(staging)
        raise
    publish(staging, out)
    return out


def mark_export(folder: Path) -> None:
    write_text(folder / MARKER, "written by layerdrop: `layerdrop export --overwrite` may replace this folder\n")


def check_tokenizer(path: Path, vocab_size: int) -> None:
    """A tokenizer.json that loads and fits the model's vocabulary, before it is copied."""
    try:
        tokenizer = load_tokenizer(path, "tokenizer")
    except TokenizerError as error:
        raise CheckpointError(str(error)) from None
    size = vocab_size_of(tokenizer)
    if size > vocab_size:
        raise CheckpointError(f"tokenizer {str(path)!r} has ids up to {size - 1}, beyond the model's vocabulary of "
                              f"{vocab_size}: it belongs to another model")


def _write(decoder: Any, folder: Path, extra: dict | None, tokenizer: str | os.PathLike | None) -> None:
    state = decoder.state_dict()
    with SafetensorsWriter(folder / WEIGHTS_FILE, [(k, v.dtype, tuple(v.shape)) for k, v in state.items()]) as writer:
        for name, tensor in state.items():
            writer.write(name, tensor)
    config = {"model": decoder.config.to_dict(), **(extra or {})}
    if tokenizer is not None:
        copy_file(tokenizer, folder / TOKENIZER_FILE)
        config.setdefault("tokenizer", {"file": TOKENIZER_FILE})
    else:
        config.pop("tokenizer", None)
    write_config(folder, config)


def write_config(folder: Path, config: dict[str, Any]) -> None:
    write_text(folder / CONFIG_FILE, json.dumps(config, indent=2) + "\n")


def training_record(ckpt: Checkpoint) -> dict[str, Any]:
    """What config.json keeps of the training run that wrote the checkpoint ``ckpt``."""
    metadata = ckpt.metadata
    if ckpt.form.name == "hf":  # what an HF folder says of its tokens, each of its three files whole
        return {**{k: metadata[k] for k in ("bos_token_id", "eos_token_id") if metadata.get(k) is not None},
                "tokenizer": {"hf_tokens": read_hf_tokens(ckpt.path, metadata)}}
    if ckpt.form.self_contained:
        return {k: v for k, v in metadata.items() if k != "model"}
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
    parser.add_argument("--out", required=True, help="the folder to write: new, empty, or an earlier export")
    parser.add_argument("--overwrite", action="store_true", help="replace an export already in --out (nothing "
                                                                 "else is ever replaced)")
    parser.add_argument("--format", choices=("layerdrop", "hf"), default="layerdrop",
                        help="layerdrop: model.safetensors + config.json (every family); hf: a Hugging Face "
                             "folder (LlamaForCausalLM, Qwen2ForCausalLM, ...: every family but celerity)")
    parser.add_argument("--draft-from", default=None, metavar="SEARCH_REPORT",
                        help="with --format hf: the report of `layerdrop speculate search`; its fastest lossless "
                             "exit draft goes into generation_config.json (assistant_early_exit), so "
                             "transformers' generate self-speculates")
    tokenizer = parser.add_mutually_exclusive_group()
    tokenizer.add_argument("--tokenizer", default=None, help="the tokenizer.json to include (default: the run's)")
    tokenizer.add_argument("--no-tokenizer", action="store_true", help="export the weights without a tokenizer")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        out = export_target(args.out)
        if (problem := folder_problem(out)) is not None:  # before anything is read
            raise CheckpointError(f"--out {problem}")
        if (busy := in_use(out)) is not None:  # a run writing there (its export/) right now
            raise CheckpointError(f"--out {busy}")
        check_export_target(out, args.overwrite)
        if args.draft_from is not None and args.format != "hf":
            raise CheckpointError(f"--draft-from {args.draft_from!r} needs --format hf: the draft goes into a Hugging "
                                  "Face generation_config.json (layerdrop's own commands take --draft)")
        if args.tokenizer is not None and not Path(args.tokenizer).is_file():
            raise CheckpointError(f"--tokenizer {args.tokenizer!r} does not exist")
        ckpt = Checkpoint.open(args.ckpt)
        if args.format == "hf":
            hf_config_of(ckpt.model_config)  # a family without a transformers class: refused before any weight is read
        draft = (draft_generation_entries(args.draft_from, ckpt.model_config.n_layers)
                 if args.draft_from is not None else None)
        tokenizer_file = _tokenizer_for(args, ckpt)
        if tokenizer_file is not None:
            check_tokenizer(tokenizer_file, ckpt.model_config.vocab_size)
        decoder, _ = ckpt.load_decoder()
        record = training_record(ckpt)
        if args.format == "hf":
            return _export_hf(args, out, decoder, record, tokenizer_file, draft)
        if tokenizer_file is not None:
            record["tokenizer"] = {**record.get("tokenizer", {}), "file": TOKENIZER_FILE,
                                   "sha256": sha256_of(tokenizer_file)}
        export_decoder(decoder, out, extra=record, overwrite=args.overwrite, tokenizer=tokenizer_file)
    except (CheckpointError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"exported {args.ckpt} -> {out}/{WEIGHTS_FILE} + {CONFIG_FILE}"
          + (f" + {TOKENIZER_FILE}" if tokenizer_file is not None else " (no tokenizer: --no-tokenizer)"))
    return 0


def _export_hf(args: argparse.Namespace, out: Path, decoder: Any, record: dict[str, Any],
               tokenizer: Path | None, draft: dict[str, Any] | None) -> int:
    source_config = record.get("tokenizer") or {}
    carried = source_config.get("hf_tokens")
    if isinstance(carried, dict) and isinstance(carried.get("config"), dict):
        # from an HF folder (directly or by continued pretraining): its own files' tokens, each whole
        ids, generation = carried["config"], generation_ids(carried)
        entries = tokenizer_entries(carried, tokenizer)
    else:  # a run's tokenizer record (prepared data's BOS/EOS; an eos list stays one)
        ids = {"bos_token_id": source_config.get("bos_id", record.get("bos_token_id")),
               "eos_token_id": source_config.get("eos_ids") or source_config.get("eos_id", record.get("eos_token_id"))}
        generation, entries = ids, None
    if draft is not None:
        generation = {**generation, **draft}
    write_staged(out, lambda folder: write_hf_folder(decoder, folder, tokenizer=tokenizer, ids=ids,
                                                     generation=generation, tokenizer_config=entries))
    print(f"exported {args.ckpt} -> {args.out} (Hugging Face {hf_config_of(decoder.config)['architectures'][0]}: "
          "model.safetensors, config.json, "
          "generation_config.json" + (", tokenizer.json" if tokenizer is not None else "; no tokenizer") + ")"
          + (f"; self-speculates in transformers' generate: exit draft {draft['assistant_early_exit']}, "
             f"{draft['num_assistant_tokens']} tokens a round" if draft is not None else ""))
    return 0


def _tokenizer_for(args: argparse.Namespace, ckpt: Checkpoint) -> Path | None:
    if args.no_tokenizer:
        return None
    if args.tokenizer is not None:
        return Path(args.tokenizer)
    try:
        return ckpt.find_tokenizer()
    except CheckpointError as err:  # the only error left once the checkpoint is open: none found
        raise CheckpointError(f"{err}; pass --tokenizer FILE, or --no-tokenizer to export the weights alone") from None


__all__ = ["export_decoder", "check_export_target", "is_export", "export_target", "write_staged", "mark_export",
           "check_tokenizer", "MARKER", "training_record", "write_config", "main",
           "EXPORT_FOLDER", "EXPORT_FILES"]
