"""Start-up of `layerdrop generate`: wall time to the first generated token, against a
bare ``import torch`` (the floor every command pays), each in a fresh interpreter.

    .venv/bin/python benchmarks/startup_time.py --ckpt runs/demo/tiny/checkpoints/last.ckpt
    .venv/bin/python benchmarks/startup_time.py --ckpt runs/demo/tiny/export --repeats 9
    .venv/bin/python benchmarks/startup_time.py --repeats 2     # smoke: a random demo-sized export
    .venv/bin/python benchmarks/startup_time.py --pretrain      # `pretrain`'s answers before training

``--pretrain`` times what `layerdrop pretrain` answers before any training: ``--help``, a
mistyped recipe key and a warmup as long as the run (each exits before a model exists),
through the command (``layerdrop pretrain``, which answers before Lightning) and through
the full LightningCLI parser it falls back to (``python -m framework.training.pretrain``,
what the command ran before), to benchmarks/results/startup_time_pretrain.json. One
untimed run of each first fills the parser cache (framework/recipes/parser_cache.py).

``--max-new-tokens 1``: the command ends at its first token, so its whole wall time is
the time to that token (interpreter start, imports, checkpoint safety checks, the
tokenizer, the model's load, one prompt forward). The two commands alternate, each
``--repeats`` times; medians of wall time and of the child's CPU time (user + system)
are reported, with their ratio (issue 22's goal: at most 1.5x), to
benchmarks/results/startup_time.json and as a table on stdout. Take it on an idle
machine: the load average is recorded beside the figures.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import REPO, RESULTS as RESULTS_DIR, timed, write_results

RESULTS = RESULTS_DIR / "startup_time.json"
PRETRAIN_RESULTS = RESULTS_DIR / "startup_time_pretrain.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", type=Path, default=None,
                        help="a checkpoint with its tokenizer (default: a random export of the demo's shape)")
    parser.add_argument("--prompt", default="def main(")
    parser.add_argument("--repeats", type=int, default=7, help="runs of each command, alternating")
    parser.add_argument("--pretrain", action="store_true",
                        help="time `pretrain --help`, a recipe-key typo and a refused warmup instead")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"JSON report (default {RESULTS.name}, or {PRETRAIN_RESULTS.name} with --pretrain)")
    args = parser.parse_args(argv)
    args.out = args.out or (PRETRAIN_RESULTS if args.pretrain else RESULTS)
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats} is invalid: must be >= 1")
    if args.ckpt is not None and not args.ckpt.exists():
        parser.error(f"--ckpt {str(args.ckpt)!r} does not exist")
    return args


def demo_shaped_export(folder: Path) -> Path:
    """recipes/tiny.yaml's decoder (d 256, 6 layers, vocab 8192, random weights) and a
    byte-level BPE trained on a few standard-library files, exported."""
    import sysconfig

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from framework.checkpoint import export_decoder
    from framework.config import ModelConfig
    from framework.model.decoder import Decoder

    torch.manual_seed(0)
    export_decoder(Decoder(ModelConfig(vocab_size=8192, d_model=256, n_layers=6, n_heads=4, max_seq_len=128,
                                       attention="sdpa")), folder)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [path.read_text(errors="replace") for path in sorted(stdlib.glob("*.py"))[:40]]
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>"],
                                                             show_progress=False,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def run_once(command: list[str], expected: int = 0) -> tuple[float, float]:
    """(wall seconds, the child's CPU seconds) of one run, which must exit ``expected``."""
    done, wall, cpu = timed(lambda: subprocess.run(command, capture_output=True, text=True, cwd=REPO,
                                                   env={**os.environ, "PYTHONPATH": str(REPO)}), cpu="children")
    if done.returncode != expected:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}, not {expected}:\n{done.stderr.strip()}")
    return wall, cpu


def measure(ckpt: Path, args: argparse.Namespace) -> dict:
    commands = {
        "import_torch": [sys.executable, "-c", "import torch"],
        "generate_first_token": [sys.executable, "-m", "framework.cli", "generate", "--ckpt", str(ckpt),
                                 "--prompt", args.prompt, "--max-new-tokens", "1"],
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(args.repeats):  # alternating: a change of load hits both alike
        for name, command in commands.items():
            runs[name].append(run_once(command))
    figures = {name: {"wall_s": statistics.median(w for w, _ in values),
                      "cpu_s": statistics.median(c for _, c in values),
                      "wall_all_s": [round(w, 3) for w, _ in values]} for name, values in runs.items()}
    figures["ratio_wall"] = figures["generate_first_token"]["wall_s"] / figures["import_torch"]["wall_s"]
    figures["ratio_cpu"] = figures["generate_first_token"]["cpu_s"] / figures["import_torch"]["cpu_s"]
    return figures


def pretrain_commands() -> dict[str, tuple[list[str], int]]:
    """name -> (command, expected exit status): each answer through the command and
    through the full parser."""
    tiny = str(REPO / "recipes" / "tiny.yaml")
    answers = {"help": (["--help"], 0), "typo": (["--config", tiny, "--trainer.max_stepz", "5"], 2),
               "invalid": (["--config", tiny, "--trainer.max_steps", "10", "--model.lr_schedule.warmup_steps",
                            "10"], 2)}
    commands = {"import_torch": ([sys.executable, "-c", "import torch"], 0)}
    for name, (rest, code) in answers.items():
        commands[f"pretrain_{name}"] = ([sys.executable, "-m", "framework.cli", "pretrain", *rest], code)
        commands[f"full_parser_{name}"] = ([sys.executable, "-m", "framework.training.pretrain", *rest], code)
    return commands


def measure_pretrain(args: argparse.Namespace) -> dict:
    commands = pretrain_commands()
    for command, code in commands.values():  # fills the parser cache; not timed
        run_once(command, code)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(args.repeats):
        for name, (command, code) in commands.items():
            runs[name].append(run_once(command, code))
    figures = {name: {"wall_s": statistics.median(w for w, _ in values),
                      "cpu_s": statistics.median(c for _, c in values),
                      "wall_all_s": [round(w, 3) for w, _ in values]} for name, values in runs.items()}
    floor = figures["import_torch"]
    for name in list(figures):
        if name != "import_torch":
            figures[name]["ratio_wall"] = figures[name]["wall_s"] / floor["wall_s"]
            figures[name]["ratio_cpu"] = figures[name]["cpu_s"] / floor["cpu_s"]
    return figures


def main_pretrain(args: argparse.Namespace) -> int:
    figures = measure_pretrain(args)
    report = {"repeats": args.repeats, "goal_ratio": 1.5, **figures,
              "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "load_average": os.getloadavg(), "python": platform.python_version()}
    write_results(args.out, report)
    print("| answer | `layerdrop pretrain` (wall, CPU) | full parser (wall, CPU) | ratio to `import torch` |\n"
          "|---|---|---|---|")
    floor = figures["import_torch"]
    print(f"| `import torch` | {floor['wall_s']:.2f} s, {floor['cpu_s']:.2f} s | | 1 |")
    for name in ("help", "typo", "invalid"):
        front, full = figures[f"pretrain_{name}"], figures[f"full_parser_{name}"]
        print(f"| {name} | {front['wall_s']:.2f} s, {front['cpu_s']:.2f} s | {full['wall_s']:.2f} s, "
              f"{full['cpu_s']:.2f} s | {front['ratio_wall']:.2f}x (was {full['ratio_wall']:.2f}x) |")
    print(f"load average {report['load_average'][0]:.1f}; written to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pretrain:
        return main_pretrain(args)
    with tempfile.TemporaryDirectory(prefix="startup_time-") as temporary:
        ckpt = args.ckpt or demo_shaped_export(Path(temporary) / "model")
        figures = measure(ckpt, args)
    report = {"ckpt": str(args.ckpt) if args.ckpt else "random export of recipes/tiny.yaml's decoder",
              "repeats": args.repeats, "goal_ratio": 1.5, **figures,
              "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "load_average": os.getloadavg(), "python": platform.python_version()}
    write_results(args.out, report)
    print("| command | wall (median) | CPU (median) |\n|---|---|---|")
    for name in ("import_torch", "generate_first_token"):
        print(f"| {name} | {figures[name]['wall_s']:.2f} s | {figures[name]['cpu_s']:.2f} s |")
    print(f"| ratio | {figures['ratio_wall']:.2f}x | {figures['ratio_cpu']:.2f}x |  (goal <= 1.5x)")
    print(f"load average {report['load_average'][0]:.1f}; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
