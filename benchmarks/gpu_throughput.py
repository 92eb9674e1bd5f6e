"""Throughput, MFU and step time of one `layerdrop pretrain` run, as JSON.

    python benchmarks/gpu_throughput.py --name fsdp-ild --out results/ -- \
        --config recipes/271m.yaml --trainer.max_steps 100 ...   # any pretrain arguments

Runs the real command's code (framework.pretrain.build_cli, then Trainer.fit) with
one more callback, which times every optimizer step between CUDA synchronisations and
reads the FLOPs the module says the step executed (framework/flops.py: matmuls,
causal attention, 3x forward; the rows each block really ran on). The first
``--warmup`` steps (CUDA/cuDNN autotuning, compilation) are left out of the means.

    tokens/s     tokens of the timed steps, all devices / their wall time
    MFU          executed FLOPs / (wall time x devices x peak); peak = 989.5e12, the
                 H200's dense bf16 rate (Lightning does not know "NVIDIA H200")
    dense MFU    the same with the FLOPs the step would have run without dropout

``--summarize A.json B.json ...`` prints the markdown table of several runs and, for
each strategy, the step-time saving of its layer-dropout run against its dense run
beside the saving the executed FLOPs promise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

H200_DENSE_BF16 = 989.5e12


def step_timer_class():
    import lightning.pytorch as pl
    import torch

    class StepTimer(pl.Callback):
        """Wall time, tokens and executed/dense FLOPs of every optimizer step."""

        def __init__(self) -> None:
            self.steps: list[dict[str, float]] = []
            self._start = 0.0
            self._tokens = 0
            self._executed = self._dense = 0.0

        def _sync(self, trainer: pl.Trainer) -> None:
            if trainer.strategy.root_device.type == "cuda":
                torch.cuda.synchronize(trainer.strategy.root_device)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if self._tokens == 0:
                self._sync(trainer)
                self._start = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            from framework.callbacks import optimizer_step_finished

            stats = outputs["stats"]
            self._tokens += stats.tokens
            self._executed += stats.executed.total
            self._dense += stats.dense.total
            if not optimizer_step_finished(trainer, stats):
                return
            self._sync(trainer)
            self.steps.append({"seconds": time.perf_counter() - self._start, "tokens": self._tokens,
                               "executed_flops": self._executed, "dense_flops": self._dense,
                               "mean_p": sum(stats.rates) / len(stats.rates)})
            self._tokens, self._executed, self._dense = 0, 0.0, 0.0

    return StepTimer


def measure(name: str, pretrain_args: list[str], warmup: int, peak: float) -> dict[str, Any]:
    import torch

    from framework.pretrain import build_cli

    from lightning.pytorch.callbacks import ModelCheckpoint

    cli = build_cli(pretrain_args)
    # A throughput run keeps no checkpoint (the 271M one would write ~3 GB at the end).
    cli.trainer.callbacks[:] = [cb for cb in cli.trainer.callbacks if not isinstance(cb, ModelCheckpoint)]
    timer = step_timer_class()()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.ckpt_path)
    if not cli.trainer.is_global_zero:
        return {}
    timed = timer.steps[warmup:]
    if not timed:
        raise SystemExit(f"error: only {len(timer.steps)} steps ran; --warmup {warmup} leaves none to time")
    devices = cli.trainer.world_size
    seconds = sum(s["seconds"] for s in timed)
    executed = sum(s["executed_flops"] for s in timed)
    dense = sum(s["dense_flops"] for s in timed)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.processor() or "cpu"
    return {
        "name": name,
        "date": datetime.date.today().isoformat(),
        "device": device,
        "devices": devices,
        "strategy": type(cli.trainer.strategy).__name__,
        "precision": str(cli.trainer.precision),
        "steps_timed": len(timed),
        "warmup_steps": warmup,
        "step_seconds_mean": seconds / len(timed),
        "step_seconds_median": statistics.median(s["seconds"] for s in timed),
        "tokens_per_sec": sum(s["tokens"] for s in timed) * devices / seconds,
        "mfu": executed / (seconds * peak),
        "dense_equivalent_mfu": dense / (seconds * peak),
        "executed_flops_fraction": executed / dense,
        "mean_p": statistics.fmean(s["mean_p"] for s in timed),
        "peak_flops_per_device": peak,
        "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "pretrain_args": pretrain_args,
    }


def summarize(paths: list[Path]) -> tuple[str, list[dict[str, Any]]]:
    runs = [json.loads(p.read_text()) for p in paths]
    lines = ["| run | strategy | tokens/s | MFU (executed) | step (s) | executed FLOPs / dense |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['name']} | {r['strategy']} | {r['tokens_per_sec']:,.0f} | {r['mfu']:.1%} | "
                     f"{r['step_seconds_mean']:.4f} | {r['executed_flops_fraction']:.3f} |")
    by_name = {r["name"]: r for r in runs}
    savings = []
    for r in runs:
        if not r["name"].endswith("-dense"):
            continue
        dense = r
        dropped = by_name.get(r["name"][: -len("-dense")] + "-ild-dts")
        if dropped is None:
            continue
        measured = 1 - dropped["step_seconds_mean"] / dense["step_seconds_mean"]
        promised = 1 - dropped["executed_flops_fraction"]
        savings.append({"strategy": dense["strategy"], "step_time_saving": measured, "flops_saving": promised,
                        "realised_over_promised": measured / promised if promised > 0 else None})
        ratio = f"{measured / promised:.2f}" if promised > 0 else "n/a"
        lines += ["", f"{dense['strategy']}: step time saving {measured:.1%} vs executed-FLOPs saving "
                      f"{promised:.1%} (realised/promised {ratio})"]
    return "\n".join(lines), savings


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pretrain_args: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, pretrain_args = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", help="this run's name (e.g. fsdp-dense, fsdp-ild-dts)")
    parser.add_argument("--out", type=Path, help="folder for <name>.json")
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the means (default 10)")
    parser.add_argument("--peak", type=float, default=H200_DENSE_BF16, help="peak FLOP/s per device for MFU")
    parser.add_argument("--summarize", nargs="+", type=Path, metavar="JSON", help="tabulate earlier runs")
    args = parser.parse_args(argv)
    if args.summarize:
        table, savings = summarize(args.summarize)
        print(table)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            runs = [json.loads(p.read_text()) for p in args.summarize]
            (args.out / "gpu_check.json").write_text(json.dumps({"runs": runs, "savings": savings}, indent=2) + "\n")
        return 0
    if not args.name or not args.out or not pretrain_args:
        parser.error("give --name, --out and the pretrain arguments after --, or --summarize")
    if args.warmup < 0:
        parser.error(f"--warmup {args.warmup} is invalid: must be >= 0")
    result = measure(args.name, pretrain_args, args.warmup, args.peak)
    if result:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "pretrain_args"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
