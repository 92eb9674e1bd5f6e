"""What checkpoints cost on CPU, in seconds per GB: the export every pretraining run
writes at its end, the safety checks before a checkpoint is loaded, and load_decoder.

1. Four real `layerdrop pretrain` runs of the same model (``--d-model``/``--layers``,
   vocab 512): single device (a .ckpt file), FSDP2 on 2 gloo ranks (a DCP folder),
   DeepSpeed ZeRO-2 and ZeRO-3 on 2 CPU ranks (the tests' CPU strategy,
   tests/distributed/cpu_deepspeed.py). Each ends with FinalExport, whose own timing
   line (wall and rank-0 CPU seconds) is read from the run's log.
2. In this process, ``--repeats`` interleaved rounds over the four checkpoints of
   ``prove_checkpoint_harmless`` (every pickled file unpickled by weights-only rules)
   and ``load_decoder`` (which proves too, then reads the model). Medians, wall and
   CPU (process) time.

Seconds per GB: the export and load_decoder per GB of fp32 model weights (what they
move), the safety checks per GB of checkpoint on disk (weights + optimizer state +
metadata, what they are given). The files are read from the page cache (the runs
have just written them): cold-disk reads add the disk's own time. Results go to
benchmarks/results/checkpoint_cost.json and a markdown table on stdout; the load
average is recorded beside them: take the numbers on an idle machine.

    .venv/bin/python benchmarks/checkpoint_cost.py                          # ~400 MB model
    .venv/bin/python benchmarks/checkpoint_cost.py --d-model 64 --layers 2 --repeats 2   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import REPO, RESULTS as RESULTS_DIR, timed, write_results
from framework.files.atomic_write import write_text

RESULTS = RESULTS_DIR / "checkpoint_cost.json"
FORMS = {
    "single": ("auto", 1),
    "fsdp": ("fsdp", 2),
    "zero2": ({"class_path": "cpu_deepspeed.CPUDeepSpeedStrategy", "init_args": {"stage": 2}}, 2),
    "zero3": ({"class_path": "cpu_deepspeed.CPUDeepSpeedStrategy", "init_args": {"stage": 3}}, 2),
}
GB = 1e9


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d-model", type=int, default=1024, help="width (default 1024: ~100M parameters)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds of the in-process timings")
    parser.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated, from {', '.join(FORMS)}")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the runs go (default: a temp folder)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                                                             "LOCAL_RANK", "NODE_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "distributed"), str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def prepare(data: Path) -> None:
    if (data / "manifest.json").is_file():
        return
    subprocess.run([sys.executable, "-m", "framework.cli", "prepare", "--corpus", "builtin", "--tokenizer", "train",
                    "--vocab-size", "512", "--max-tokens", "200k", "--val-fraction", "0.05", "--workers", "1",
                    "--no-progress", "--out", str(data)], check=True, cwd=REPO, env=child_env())


def recipe(path: Path, *, data: Path, root: Path, strategy, devices: int, args: argparse.Namespace) -> Path:
    config = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": devices, "strategy": strategy, "precision": "32-true",
                    "max_steps": 1, "default_root_dir": str(root), "enable_progress_bar": False,
                    "enable_model_summary": False, "logger": False, "limit_val_batches": 0},
        "model": {"decoder": {"vocab_size": 512, "d_model": args.d_model, "n_layers": args.layers,
                              "n_heads": max(1, args.d_model // 64), "max_seq_len": 32, "attention": "sdpa"},
                  "layer_dropout": {"p_max": 0.0}},
        "data": {"data_dir": str(data), "seq_len": 32, "batch_size": 2, "num_workers": 0, "val_batches": 1},
        "checkpoint": {"every_n_steps": 1000, "keep_last": 1},
    }
    write_text(path, json.dumps(config, indent=2))
    return path


def train(name: str, work: Path, data: Path, args: argparse.Namespace) -> dict:
    strategy, devices = FORMS[name]
    out = work / name
    out.mkdir(parents=True, exist_ok=True)
    log = out / "log.txt"
    if not (out / "run" / "export" / "model.safetensors").is_file():
        config = recipe(out / "recipe.json", data=data, root=out / "run", strategy=strategy, devices=devices,
                        args=args)
        with open(log, "w") as handle:
            subprocess.run([sys.executable, "-m", "framework.cli", "pretrain", "--config", str(config)], check=True,
                           cwd=REPO, env=child_env(), stdout=handle, stderr=subprocess.STDOUT)
    timing = re.search(r"exported the final model to .* in ([\d.]+) s, ([\d.]+) CPU s", log.read_text())
    checkpoint = (out / "run" / "checkpoints" / "last.ckpt").resolve()
    files = [checkpoint] if checkpoint.is_file() else [p for p in checkpoint.rglob("*") if p.is_file()]
    return {"checkpoint": checkpoint, "checkpoint_bytes": sum(p.stat().st_size for p in files),
            "model_bytes": (out / "run" / "export" / "model.safetensors").stat().st_size,
            "export_wall_s": float(timing.group(1)) if timing else None,
            "export_cpu_s": float(timing.group(2)) if timing else None}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.forms.split(",") if n.strip()]
    unknown = [n for n in names if n not in FORMS]
    if unknown:
        print(f"error: --forms {unknown} are invalid: allowed {', '.join(FORMS)}", file=sys.stderr)
        return 2
    from framework.checkpoint import load_decoder
    from framework.checkpoint.safety import prove_checkpoint_harmless

    with tempfile.TemporaryDirectory(prefix="checkpoint_cost-") as temporary:
        work = args.work_dir or Path(temporary)
        data = work / "data"
        prepare(data)
        runs = {name: train(name, work, data, args) for name in names}
        samples: dict[str, dict[str, list]] = {n: {"prove": [], "load": []} for n in names}
        for name in names:  # an untimed round first: imports and first-call costs are not per-GB costs
            load_decoder(runs[name]["checkpoint"])
        for _ in range(args.repeats):  # interleaved: a change in the machine's load hits every form alike
            for name in names:
                path = runs[name]["checkpoint"]
                samples[name]["prove"].append(timed(lambda: prove_checkpoint_harmless(path))[1:])
                samples[name]["load"].append(timed(lambda: load_decoder(path))[1:])
        results = {}
        for name in names:
            r = runs[name]
            prove = [statistics.median(x) for x in zip(*samples[name]["prove"])]
            load = [statistics.median(x) for x in zip(*samples[name]["load"])]
            results[name] = {
                "checkpoint_gb": r["checkpoint_bytes"] / GB, "model_gb": r["model_bytes"] / GB,
                "export_s_per_model_gb": _per(r["export_wall_s"], r["model_bytes"]),
                "export_cpu_s_per_model_gb": _per(r["export_cpu_s"], r["model_bytes"]),
                "safety_checks_s_per_checkpoint_gb": _per(prove[0], r["checkpoint_bytes"]),
                "safety_checks_cpu_s_per_checkpoint_gb": _per(prove[1], r["checkpoint_bytes"]),
                "load_decoder_s_per_model_gb": _per(load[0], r["model_bytes"]),
                "load_decoder_cpu_s_per_model_gb": _per(load[1], r["model_bytes"]),
                "seconds": {"export": r["export_wall_s"], "safety_checks": prove[0], "load_decoder": load[0]},
            }
    report = {"benchmark": "checkpoint_cost", "d_model": args.d_model, "layers": args.layers,
              "repeats": args.repeats, "torch_threads": os.environ.get("OMP_NUM_THREADS"),
              "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "load_average": os.getloadavg(), "page_cache": "warm (the runs just wrote the files)",
              "forms": results}
    write_results(args.out, report)
    print(table(report))
    print(f"\nwrote {args.out.relative_to(REPO) if args.out.is_relative_to(REPO) else args.out}")
    return 0


def _per(seconds: float | None, size: int) -> float | None:
    return None if seconds is None or size == 0 else seconds / (size / GB)


def table(report: dict) -> str:
    lines = [f"checkpoint cost, d={report['d_model']} L={report['layers']} (load average "
             f"{report['load_average'][0]:.1f}), seconds per GB (CPU seconds in brackets)", "",
             "| form | model GB | checkpoint GB | final export s/GB | safety checks s/GB | load_decoder s/GB |",
             "|---|---|---|---|---|---|"]
    for name, r in report["forms"].items():
        def cell(wall, cpu):
            return "n/a" if wall is None else f"{wall:.2f} ({cpu:.2f})"

        lines.append(f"| {name} | {r['model_gb']:.3f} | {r['checkpoint_gb']:.3f} | "
                     f"{cell(r['export_s_per_model_gb'], r['export_cpu_s_per_model_gb'])} | "
                     f"{cell(r['safety_checks_s_per_checkpoint_gb'], r['safety_checks_cpu_s_per_checkpoint_gb'])} | "
                     f"{cell(r['load_decoder_s_per_model_gb'], r['load_decoder_cpu_s_per_model_gb'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
