"""The flags every eval-type command shares, spelled, defaulted and checked one way.

Layer numbering, the one convention of every command (and of the paper): the L blocks
are numbered 0..L-1, and an early exit is named by how many blocks run before it, so
exit K runs blocks 0..K-1 (K in 1..L; exit L is the full model). Skip sets name blocks
(0..L-1); exits, adapter exits and draft exits name counts (1..L).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import torch

from framework.files.output_path import exists_message, file_problem

LAYERS = "blocks are numbered 0..L-1; exit K runs blocks 0..K-1 (K in 1..L)"
EXIT_HELP = f"early exit K: run blocks 0..K-1 then the final norm + head ({LAYERS})"
SKIP_HELP = (f"skip set: block indices i,j,k, a range a-b, alternate-odd, alternate-even or none "
             f"({LAYERS})")
DEVICE_HELP = "auto (default: cuda if available, else cpu), cpu, cuda, cuda:N"


def add_checkpoint(parser: argparse.ArgumentParser, *, several: bool = False) -> None:
    if several:
        parser.add_argument("--ckpt", nargs="+", action="extend", required=True, metavar="PATH",
                            help="checkpoint(s): a .ckpt from `layerdrop pretrain` or an exported folder; "
                                 "several land on one plot (--ckpt A B or --ckpt A --ckpt B)")
    else:
        parser.add_argument("--ckpt", required=True, metavar="PATH",
                            help="a .ckpt from `layerdrop pretrain` or an exported folder")


def check_checkpoint(parser: argparse.ArgumentParser, path: str) -> None:
    """The cheap check first: a missing checkpoint is named before anything else is read."""
    if not Path(path).exists():
        parser.error(f"checkpoint {path!r} does not exist")


def checkpoint_label(path: str | Path) -> str:
    """The name every command gives a checkpoint in its output: its run's name, whichever
    form was read (runs/x/checkpoints/last.ckpt, runs/x/export -> x); a loose file's stem
    and any other folder's own name otherwise."""
    return checkpoint_labels([path])[0]


def checkpoint_labels(paths: Sequence[str | Path]) -> list[str]:
    """Short distinct names for several checkpoints: each one's ``checkpoint_label``, else
    run/name (x/step-100), else the whole path."""
    def run_folder(path: Path) -> Path | None:
        if path.suffix == ".ckpt" and path.parent.name == "checkpoints":
            return path.parent.parent
        return path.parent if path.name == "export" else None  # pretrain's end-of-run export

    def run(path: Path) -> str:
        folder = run_folder(path)
        return folder.name if folder is not None else path.stem if path.suffix == ".ckpt" else path.name

    def run_and_name(path: Path) -> str:
        folder = run_folder(path) or path.parent
        return f"{folder.name}/{path.stem if path.suffix == '.ckpt' else path.name}"

    for naming in (run, run_and_name, str):
        labels = [naming(Path(p)) for p in paths]
        if len(set(labels)) == len(labels) and all(labels):
            return labels
    return [str(p) for p in paths]


def add_device(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", help=DEVICE_HELP)


def add_threads(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


# --compile's shapes -> CompiledStep's ``static`` (None: static on a GPU, where CUDA graphs record them)
COMPILE_SHAPES = {"auto": None, "static": True, "dynamic": False}


def add_compile(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compile", nargs="?", const="auto", default=None, choices=tuple(COMPILE_SHAPES),
                        metavar="SHAPES",
                        help="torch.compile the decoding steps (eval/decoding/compiled_step.py): faster per token "
                             "once compiled, which costs seconds to a minute first; the same tokens. SHAPES: "
                             "auto (default: static on a GPU, dynamic on a CPU), static (a fixed-size cache, "
                             "every step one shape: CUDA graphs on a GPU), dynamic (the cache grows each step)")


def compile_static(shapes: str | None) -> bool | None:
    """--compile's SHAPES as CompiledStep's ``static`` (None without --compile)."""
    return None if shapes is None else COMPILE_SHAPES[shapes]


def add_tokenizer(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokenizer", default=None, metavar="JSON",
                        help="tokenizer.json (default: beside the checkpoint, or in the data folder it trained on)")
    parser.add_argument("--eot-token", default=None, metavar="TOKEN",
                        help="the end-of-text token (default: the data manifest's EOS, else the usual names)")


def add_adapters(parser: argparse.ArgumentParser, use: str) -> None:
    parser.add_argument("--adapters", default=None, metavar="DIR",
                        help=f"exit adapters written by `layerdrop adapters fit`: {use}")


def add_prompt_arguments(parser: argparse.ArgumentParser, *, count: int | None = 8) -> None:
    """Where prompts come from (one of them); ``count=None`` leaves the number to the caller."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", action="append", default=None, metavar="TEXT",
                        help="a text prompt (repeatable); it starts a new document (EOS first)")
    source.add_argument("--prompts", metavar="FILE",
                        help="prompts: one a line, a .jsonl file with a \"text\" field, or a .json list of "
                             "strings or of token-id lists")
    source.add_argument("--data", metavar="DIR", help="a folder made by `layerdrop prepare`: the first "
                                                       "validation sequences, --prompt-len tokens each")
    if count is not None:
        parser.add_argument("--num-prompts", type=int, default=count,
                            help=f"at most this many prompts (default {count})")
    parser.add_argument("--prompt-len", type=int, default=32, help="prompt tokens, with --data (default 32)")
    parser.add_argument("--prompt-offset", type=int, default=0, metavar="N",
                        help="pass over the first N prompts (e.g. those a `speculate search` calibrated on, to "
                             "decode held-out ones; default 0)")
    add_max_new_tokens(parser)
    add_tokenizer(parser)


def add_max_new_tokens(parser: argparse.ArgumentParser, default: int = 64) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help=f"tokens generated per prompt (default {default}, at most half the model's context)")
    parser.set_defaults(max_new_tokens_default=default)


def max_new_tokens(args: argparse.Namespace, max_seq_len: int) -> int:
    """--max-new-tokens, or its default capped at half the context; a value that leaves
    the prompt no room is a ValueError."""
    if args.max_new_tokens is None:
        return max(1, min(args.max_new_tokens_default, max_seq_len // 2))
    if args.max_new_tokens >= max_seq_len:
        raise ValueError(f"--max-new-tokens={args.max_new_tokens} is invalid: must be below the model's context "
                         f"(max_seq_len {max_seq_len}), which also holds the prompt")
    return args.max_new_tokens


def check_cache_fits(model: torch.nn.Module, sequences: int, tokens: int, device: torch.device) -> None:
    """ValueError (one line) when a KV cache for ``sequences`` rows of ``tokens`` positions
    would not fit in the device's free memory. The window bounds --max-new-tokens, but a
    window is what a config claims (a Hugging Face folder may say 10^12 tokens): what is
    allocated from it is checked here, before the allocator fails with a traceback."""
    probe = model.new_cache(1, 1)
    per_position = sum(t.nbytes for t in [*probe.keys, *probe.values, probe.padding])
    needed, free = per_position * sequences * tokens, free_memory(device)
    if free is not None and needed > free:
        raise ValueError(f"the KV cache of {sequences} prompt(s) x {tokens:,} positions (prompt + --max-new-tokens) "
                         f"needs {needed / 1e9:,.1f} GB, more than the {free / 1e9:,.1f} GB free on {device}: lower "
                         "--max-new-tokens or --batch-size")


def free_memory(device: torch.device) -> int | None:
    """Bytes free on ``device``: CUDA's count, or the kernel's MemAvailable (None where unknown)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as handle:
            fields = dict(line.split(":", 1) for line in handle if ":" in line)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def add_output(parser: argparse.ArgumentParser, *, plot: bool = False, required: bool = True,
               what: str = "report path (JSON)") -> None:
    parser.add_argument("--out", required=required, default=None, metavar="PATH", help=what)
    if plot:
        parser.add_argument("--plot", default=None, metavar="PNG", help="plot path (default: --out with .png)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing output files")


def refuse_existing(parser: argparse.ArgumentParser, paths: Sequence[str | Path | None], overwrite: bool) -> None:
    """Before any work: each output file can be written (framework/files/output_path.py's rule:
    never a folder, an existing file only with --overwrite, a writable folder to hold it)."""
    for path in paths:
        if path is not None and (problem := file_problem(path, overwrite)) is not None:
            parser.error(problem)


def check_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, names: Sequence[str], *,
                   zero_ok: Sequence[str] = ()) -> None:
    """``--name`` must be >= 1 (>= 0 for ``zero_ok``) where given."""
    for name in names:
        value = getattr(args, name)
        low = 0 if name in zero_ok else 1
        if value is not None and value < low:
            kind = "a non-negative" if low == 0 else "a positive"
            parser.error(f"--{name.replace('_', '-')}={value} is invalid: must be {kind} integer")


def resolve_device(parser: argparse.ArgumentParser, name: str | None) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        parser.error(f"--device {name!r} is invalid: allowed: auto, cpu, cuda, cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {name!r} is invalid: no CUDA device is available")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device {name!r} is invalid: allowed: auto, cpu, cuda, cuda:N")
    return device


def apply_threads(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)


__all__ = ["LAYERS", "EXIT_HELP", "SKIP_HELP", "add_prompt_arguments", "add_max_new_tokens", "max_new_tokens",
           "check_cache_fits", "free_memory",
           "add_checkpoint", "check_checkpoint", "add_device", "add_threads", "add_tokenizer", "add_adapters",
           "add_output", "exists_message", "refuse_existing", "check_positive", "resolve_device", "apply_threads"]
