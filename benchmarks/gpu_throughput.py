"""Throughput, MFU and step time of one `layerdrop pretrain` run, as JSON.

    python benchmarks/gpu_throughput.py --name fsdp-ild --out results/ -- \
        --config recipes/271m.yaml --trainer.max_steps 100 ...   # any pretrain arguments

Runs the real command's code (framework.training.pretrain.build_cli, then Trainer.fit) with
one more callback, which times every optimizer step between CUDA synchronisations and
reads the FLOPs the module says the step executed (framework/flops.py: matmuls,
causal attention, 3x forward; the rows each block really ran on). The first
``--warmup`` steps (CUDA/cuDNN autotuning, compilation) are left out of the means.

    tokens/s     tokens of the timed steps, all devices / their wall time
    MFU          executed FLOPs / (wall time x devices x peak); peak = 989.5e12, the
                 H200's dense bf16 rate (Lightning does not know "NVIDIA H200")
    dense MFU    the same with the FLOPs the step would have run without dropout
    graphs       with ``--model.compile true``: torch._dynamo's graphs after every step
                 (the blocks share their compiled code, so graphs per block = graphs /
                 layers), and whether any block hit the recompile limit (it then runs
                 eager, silently)

``--summarize A.json B.json ...`` prints the markdown table of several runs and the
comparisons between them: per strategy, the step-time saving of its layer-dropout
run ("X-ild-dts") against its dense run ("X-dense") beside the saving the executed
FLOPs promise; bf16 against fp32 FSDP2 collectives ("fsdp-fp32-dense" vs
"fsdp-bf16-dense"); compile on against off ("X" vs "X-compile"), with the graph count.
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

from harness import write_results

H200_DENSE_BF16 = 989.5e12


def step_timer_class():
    import lightning.pytorch as pl
    import torch

    class StepTimer(pl.Callback):
        """Wall time, tokens and executed/dense FLOPs of every optimizer step."""

        def __init__(self) -> None:
            self.steps: list[dict[str, float]] = []
            self.graphs: list[int] = []  # torch._dynamo's unique graphs after each step
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
            from framework.training.callbacks import optimizer_step_finished

            stats = outputs["stats"]
            self._tokens += stats.tokens
            self._executed += stats.executed.total
            self._dense += stats.dense.total
            if not optimizer_step_finished(trainer, stats):
                return
            self._sync(trainer)
            self.steps.append({"seconds": time.perf_counter() - self._start, "tokens": self._tokens,
                               "executed_flops": self._executed, "dense_flops": self._dense,
                               "mean_p": sum(stats.rates) / len(stats.rates),
                               "kept_rows": [rows for rows, _ in stats.kept_counts]})
            self._tokens, self._executed, self._dense = 0, 0.0, 0.0
            if pl_module.compile_blocks:
                from torch._dynamo.utils import counters

                self.graphs.append(counters["stats"]["unique_graphs"])

    return StepTimer


def measure(name: str, pretrain_args: list[str], warmup: int, peak: float) -> dict[str, Any]:
    import torch

    from framework.training.pretrain import build_cli

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
        "compile": compile_report(timer, cli.model.model_cfg.n_layers) if cli.model.compile_blocks else None,
        "pretrain_args": pretrain_args,
    }


def compile_report(timer: Any, layers: int) -> dict[str, Any]:
    """Graphs torch._dynamo made over the run, against the bound of 2 per block (one
    with a drop plan, one dense), and whether the kept-row counts really changed."""
    from torch._dynamo.utils import counters

    graphs = timer.graphs
    limit_hit = any("recompile" in key.lower() for key in counters["unimplemented"])
    distinct_kept = len({tuple(s["kept_rows"]) for s in timer.steps})
    return {"steps": len(graphs), "graphs_after_each_step": graphs, "graphs": graphs[-1] if graphs else 0,
            "graphs_per_block": (graphs[-1] if graphs else 0) / layers,
            "graphs_made_after_step_1": (graphs[-1] - graphs[0]) if graphs else 0,
            "distinct_kept_row_patterns": distinct_kept, "recompile_limit_hit": limit_hit,
            "graph_breaks": sum(counters["graph_break"].values()),
            "within_bound": bool(graphs) and graphs[-1] <= 2 * layers and not limit_hit}


def summarize(paths: list[Path]) -> tuple[str, list[dict[str, Any]]]:
    runs = [json.loads(p.read_text()) for p in paths]
    lines = ["| run | strategy | tokens/s | MFU (executed) | step (s) | executed FLOPs / dense |",
             "|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['name']} | {r['strategy']} | {r['tokens_per_sec']:,.0f} | {r['mfu']:.1%} | "
                     f"{r['step_seconds_mean']:.4f} | {r['executed_flops_fraction']:.3f} |")
    by_name = {r["name"]: r for r in runs}
    comparisons: list[dict[str, Any]] = []
    for dense in runs:
        dropped = by_name.get(dense["name"].removesuffix("-dense") + "-ild-dts")
        if not dense["name"].endswith("-dense") or dropped is None:
            continue
        measured = 1 - dropped["step_seconds_mean"] / dense["step_seconds_mean"]
        promised = 1 - dropped["executed_flops_fraction"]
        ratio = measured / promised if promised > 0 else None
        comparisons.append({"kind": "ild-dts vs dense", "runs": [dense["name"], dropped["name"]],
                            "step_time_saving": measured, "flops_saving": promised, "realised_over_promised": ratio})
        lines += ["", f"{dense['name']} -> {dropped['name']}: step time saving {measured:.1%} vs executed-FLOPs "
                      f"saving {promised:.1%} (realised/promised {'n/a' if ratio is None else f'{ratio:.2f}'})"]
    if "fsdp-fp32-dense" in by_name and "fsdp-bf16-dense" in by_name:
        fp32, bf16 = by_name["fsdp-fp32-dense"], by_name["fsdp-bf16-dense"]
        speedup = bf16["tokens_per_sec"] / fp32["tokens_per_sec"]
        comparisons.append({"kind": "bf16 vs fp32 FSDP2 collectives", "runs": [fp32["name"], bf16["name"]],
                            "tokens_per_sec_ratio": speedup, "mfu": [fp32["mfu"], bf16["mfu"]]})
        lines += ["", f"FSDP2 bf16 vs fp32 all-gathers: tokens/s x{speedup:.2f} (MFU {fp32['mfu']:.1%} -> "
                      f"{bf16['mfu']:.1%})"]
    for compiled in runs:
        eager = by_name.get(compiled["name"].removesuffix("-compile"))
        if not compiled["name"].endswith("-compile") or eager is None:
            continue
        speedup = eager["step_seconds_mean"] / compiled["step_seconds_mean"]
        graphs = compiled.get("compile") or {}
        comparisons.append({"kind": "compile on vs off", "runs": [eager["name"], compiled["name"]],
                            "step_time_speedup": speedup, **{k: graphs.get(k) for k in (
                                "graphs", "graphs_per_block", "graphs_made_after_step_1", "within_bound",
                                "recompile_limit_hit", "distinct_kept_row_patterns")}})
        lines += ["", f"compile on vs off ({eager['name']}): step time x{speedup:.2f}; {graphs.get('graphs')} "
                      f"graphs over {graphs.get('steps')} steps ({graphs.get('graphs_per_block', 0):.2f} per block, "
                      f"{graphs.get('graphs_made_after_step_1')} made after step 1, "
                      f"{graphs.get('distinct_kept_row_patterns')} distinct kept-row patterns): "
                      f"{'within' if graphs.get('within_bound') else 'OVER'} the bound of 2 per block"]
    return "\n".join(lines), comparisons


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
        table, comparisons = summarize(args.summarize)
        print(table)
        if args.out:
            runs = [json.loads(p.read_text()) for p in args.summarize]
            write_results(args.out / "gpu_check.json", {"runs": runs, "comparisons": comparisons})
        return 0
    if not args.name or not args.out or not pretrain_args:
        parser.error("give --name, --out and the pretrain arguments after --, or --summarize")
    if args.warmup < 0:
        parser.error(f"--warmup {args.warmup} is invalid: must be >= 0")
    result = measure(args.name, pretrain_args, args.warmup, args.peak)
    if result:
        write_results(args.out / f"{args.name}.json", result)
        print(json.dumps({k: v for k, v in result.items() if k != "pretrain_args"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
