"""The `layerdrop` front door: the composition root of all commands.

Each command lives in its own module with a ``main(argv) -> int`` function; this file
only routes to it, importing lazily so `layerdrop --help` stays instant and
``framework``'s library code never imports ``eval`` or ``data_prep``.
"""

from __future__ import annotations

import importlib
import sys

from framework import __version__
from framework.console.library_noise import quiet_library_noise

# command -> (module:function, one-line help). Two-word commands are groups.
COMMANDS: dict[str, tuple[str, str]] = {
    "prepare": ("data_prep.prepare:main", "corpus -> tokenizer -> litdata token chunks (+ manifest.json)"),
    "prepare merge": ("data_prep.merge:main", "join the parts of a prepare --shard I/N run into one folder"),
    "pretrain": ("framework.recipes.pretrain_front:main", "pretrain with layer dropout (LightningCLI fit)"),
    "recipe": ("framework.recipes.recipe:main", "write a recipe for a size, token budget and devices (Table A.2's rules)"),
    "export": ("framework.checkpoint.export:main", "any checkpoint -> model.safetensors + config.json + tokenizer.json"),
    "eval exits": ("eval.measurements.exits:exits_main", "validation loss at every early-exit layer (one pass)"),
    "eval skip": ("eval.measurements.exits:skip_main", "loss vs parameters kept when skipping layer sets"),
    "eval heldout": ("eval.measurements.heldout:main",
                     "validation loss at every exit on many held-out tokens, with its noise"),
    "eval coord-check": ("eval.measurements.coord_check:main", "the paper's coordinate check (Fig. 2)"),
    "eval downstream": ("eval.downstream.harness:main", "downstream benchmarks through lm-eval"),
    "eval dynamic": ("eval.decoding.threshold_curve:main", "dynamic early exit: agreement and loss vs layers per token"),
    "adapters fit": ("eval.adapters.fit:fit_main", "train exit adapters on a frozen backbone"),
    "adapters eval": ("eval.adapters.evaluation:eval_main", "per-exit loss with adapters vs plain early exit"),
    "speculate search": ("eval.decoding.draft_search:main", "search the draft's skip set for the fastest lossless draft"),
    "speculate run": ("eval.decoding.speedup:main", "self-speculative decoding timed against plain decoding"),
    "generate": ("eval.decoding.generate:main", "text in, text out: full, exit:K, skip:SET, speculative or dynamic depth"),
    "sweep": ("eval.experiments.sweep.runner:main",
              "a grid of pretraining runs + their evaluations (local pool or SLURM array)"),
    "tune": ("eval.experiments.sweep.tune:main",
             "tune a base model by successive 1-D sweeps (η, σ, τ_EMA), then confirm with seeds"),
    "report": ("eval.experiments.report.build:main",
               "the paper's tables and plots from a sweep folder (Markdown + PNG + JSON)"),
}


def _usage() -> str:
    lines = [f"layerdrop {__version__}: LLM pretraining with layer dropout, and the inference it enables",
             "", "usage: layerdrop <command> [<subcommand>] [options]   (each command has --help)", "",
             "commands:"]
    return "\n".join(lines + _listing(COMMANDS))


def _group_usage(group: str) -> str:
    members = {name: entry for name, entry in COMMANDS.items() if name.startswith(group + " ")}
    lines = [f"usage: layerdrop {group} <subcommand> [options]   (each subcommand has --help)", "",
             "subcommands:"]
    return "\n".join(lines + _listing(members))


def _listing(commands: dict[str, tuple[str, str]]) -> list[str]:
    width = max(len(name) for name in commands)
    return [f"  {name:<{width}}  {help_}" for name, (_, help_) in commands.items()]


def _refuse(message: str, where: str = "layerdrop") -> int:
    print(f"error: {message}; see {where} --help", file=sys.stderr)
    return 2


def _groups() -> set[str]:
    """Commands with subcommands (``eval``, ``adapters``, ``speculate``); not ``prepare``,
    a command itself that also has one (``prepare merge``)."""
    return {name.split()[0] for name in COMMANDS if " " in name} - set(COMMANDS)


def _resolve(argv: list[str]) -> tuple[str, list[str]] | None:
    if len(argv) >= 2 and f"{argv[0]} {argv[1]}" in COMMANDS:
        return f"{argv[0]} {argv[1]}", argv[2:]
    if argv and argv[0] in COMMANDS:
        return argv[0], argv[1:]
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version", "version"):
        print(f"layerdrop {__version__}")
        return 0
    first = argv[0]
    if first in _groups() and argv[1:2] in ([], ["-h"], ["--help"], ["help"]):  # alone, as `layerdrop` alone
        print(_group_usage(first))
        return 0
    resolved = _resolve(argv)
    if resolved is None:
        if first not in _groups():
            names = sorted({name.split()[0] for name in COMMANDS})
            return _refuse(f"unknown command {first!r}; allowed: {', '.join(names)}")
        subs = [name.split()[1] for name in COMMANDS if name.startswith(first + " ")]
        given = argv[1] if len(argv) > 1 else "(none)"
        return _refuse(f"unknown subcommand {given!r}; allowed: {', '.join(subs)}",
                       f"layerdrop {first}")
    name, rest = resolved
    quiet_library_noise()
    target, _ = COMMANDS[name]
    module_name, func_name = target.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    return int(func(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
