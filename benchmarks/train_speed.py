"""What does the training loop cost, and does layer dropout save the time it promises?

Two measurements on the tiny recipe's shape (d=256, L=6, vocab 8192, 8 × 128 tokens):

  1. Loop overhead: dense tokens/s of the Lightning loop `layerdrop pretrain` runs
     (LayerDropModule with its schedule callback and NaN guard, Throughput, a
     TensorBoard logger, learning-rate monitor) against a plain PyTorch loop that trains
     the same Decoder (same init, same AdamW groups and LR schedule, same loss) on the
     same batches. Goal: ratio >= 0.97.
  2. Layer-dropout saving in the real loop: step time with ILD p_max 0.4 on a constant
     schedule against the dense run. Theoretical saving = 1 - executed/dense FLOPs of
     the masks actually drawn (framework/flops.py, all S keys per query as SDPA
     computes them; the embedding lookup, unembedding and loss are not saved).
     Goal: realized / theoretical >= 0.9 on CPU.

Every variant runs ``--reps`` times, interleaved (rotated each repetition) so that load
from other jobs hits all alike. Within a repetition each variant's step time is the
median over its steps after ``--warmup``; the ratios are formed within a repetition
(the variants ran minutes apart at most) and the median over repetitions is reported,
so a machine whose load drifts during the benchmark does not bias them. CPU time of
this process is reported beside wall time: it is steadier when the machine is shared.

    .venv/bin/python benchmarks/train_speed.py          # writes benchmarks/results/train_speed.json
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
from pathlib import Path

# Before torch starts OpenMP: spinning waiters stall each other on a shared machine
# (see benchmarks/layer_dropout_speed.py); passive waiting is what the demo uses too.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from harness import RESULTS as RESULTS_DIR, clocks, write_results  # noqa: E402  (first: the repository's packages)
import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.callbacks import LearningRateMonitor  # noqa: E402
from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from framework.training.callbacks import Throughput  # noqa: E402
from framework.config import LayerDropoutConfig, ModelConfig, ParametrizationConfig  # noqa: E402
from framework.flops import dense_step_flops, executed_step_flops  # noqa: E402
from framework.training.lr_schedule import LRScheduleConfig, schedule_for  # noqa: E402
from framework.training.module import LayerDropModule  # noqa: E402
from framework.training.parametrization import param_groups  # noqa: E402

RESULTS = RESULTS_DIR / "train_speed.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per repetition")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the timing")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def module_for(args: argparse.Namespace, p_max: float) -> LayerDropModule:
    return LayerDropModule(
        decoder=ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                            max_seq_len=args.seq_len, attention="sdpa"),
        layer_dropout=LayerDropoutConfig(p_max=p_max, distribution="increasing", schedule="constant"),
        parametrization=ParametrizationConfig(d_base=args.d_model, n_layers_base=args.layers),
        lr_schedule=LRScheduleConfig(warmup_steps=2))


def batches(args: argparse.Namespace) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, args.vocab, (args.batch_size * args.steps, args.seq_len + 1), generator=gen)
    return TensorDataset(rows[:, :-1], rows[:, 1:])


class StepClock(pl.Callback):
    """Wall and CPU seconds of every optimizer step, and the FLOPs it executed."""

    def __init__(self) -> None:
        self.wall, self.cpu, self.executed, self.dense = [], [], 0.0, 0.0
        self._marks: tuple[float, float] | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._marks is None:
            self._marks = clocks()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        wall, cpu = clocks()
        self.wall.append(wall - self._marks[0])
        self.cpu.append(cpu - self._marks[1])
        self._marks = (wall, cpu)
        # All S keys per query: SDPA with an additive mask computes every score.
        stats, (rows, seq) = outputs["stats"], batch[0].shape
        cfg = pl_module.model_cfg
        self.executed += executed_step_flops(cfg, stats.kept_counts, seq, batch_size=rows, causal=False).total
        self.dense += dense_step_flops(cfg, rows, seq, causal=False).total


def lightning_run(args: argparse.Namespace, p_max: float, seed: int) -> StepClock:
    torch.manual_seed(seed)
    module = module_for(args, p_max)
    clock = StepClock()
    with tempfile.TemporaryDirectory() as logs:
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=args.steps, logger=TensorBoardLogger(logs),
                             callbacks=[Throughput(), LearningRateMonitor("step"), clock],
                             enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                             limit_val_batches=0, num_sanity_val_steps=0, log_every_n_steps=10)
        trainer.fit(module, DataLoader(batches(args), batch_size=args.batch_size))
    return clock


def plain_run(args: argparse.Namespace, seed: int) -> StepClock:
    """The same Decoder, init, optimizer groups, LR schedule and loss, in a bare loop."""
    torch.manual_seed(seed)
    module = module_for(args, 0.0)
    module.configure_model()
    model = module.model.train()
    optimizer = torch.optim.AdamW(param_groups(model, module.param_cfg, total_tokens=float(args.steps),
                                               batch_tokens=1.0), betas=module.param_cfg.betas)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_for(module.lr_cfg, args.steps))
    clock = StepClock()
    marks = clocks()
    for inputs, targets in DataLoader(batches(args), batch_size=args.batch_size):
        loss = module.loss(inputs, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        wall, cpu = clocks()
        clock.wall.append(wall - marks[0])
        clock.cpu.append(cpu - marks[1])
        marks = (wall, cpu)
    return clock


def measure(args: argparse.Namespace) -> dict[str, dict]:
    """{clock: {variant: [median step seconds of each repetition]}} and the ILD FLOPs."""
    variants = {"plain_dense": lambda seed: plain_run(args, seed),
                "lightning_dense": lambda seed: lightning_run(args, 0.0, seed),
                "lightning_ild": lambda seed: lightning_run(args, 0.4, seed)}
    medians: dict[str, dict[str, list[float]]] = {"wall": {n: [] for n in variants},
                                                  "cpu": {n: [] for n in variants}}
    flops = {"executed": 0.0, "dense": 0.0}
    names = list(variants)
    for rep in range(args.reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            clock = variants[name](rep)
            medians["wall"][name].append(statistics.median(clock.wall[args.warmup:]))
            medians["cpu"][name].append(statistics.median(clock.cpu[args.warmup:]))
            if name == "lightning_ild":
                flops["executed"] += clock.executed
                flops["dense"] += clock.dense
            print(f"rep {rep} {name}: median step {medians['wall'][name][-1]:.3f} s wall, "
                  f"{medians['cpu'][name][-1]:.3f} s CPU", flush=True)
    return {"medians": medians, "flops": flops}


def summarise(args: argparse.Namespace, measured: dict) -> dict:
    tokens = args.batch_size * args.seq_len
    result = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "machine": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                          "processor": platform.processor() or platform.machine(), "torch": torch.__version__,
                          "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}}
    theoretical = 1.0 - measured["flops"]["executed"] / measured["flops"]["dense"]
    for clock, per_rep in measured["medians"].items():
        reps = range(args.reps)
        overhead = [per_rep["plain_dense"][r] / per_rep["lightning_dense"][r] for r in reps]
        saving = [1.0 - per_rep["lightning_ild"][r] / per_rep["lightning_dense"][r] for r in reps]
        step = {name: statistics.median(values) for name, values in per_rep.items()}
        result[clock] = {
            "median_step_s": step,
            "tokens_per_s": {name: tokens / s for name, s in step.items()},
            "per_repetition_step_s": per_rep,
            "lightning_over_plain": statistics.median(overhead),
            "realized_saving": statistics.median(saving),
            "realized_over_theoretical": statistics.median(saving) / theoretical,
        }
    result["theoretical_saving"] = theoretical
    return result


def table(result: dict) -> str:
    wall, cpu = result["wall"], result["cpu"]
    rows = ["| measure | wall clock | CPU time | goal |", "|---|---|---|---|"]
    for name in ("plain_dense", "lightning_dense", "lightning_ild"):
        rows.append(f"| tokens/s, {name.replace('_', ' ')} | {wall['tokens_per_s'][name]:,.0f} | "
                    f"{cpu['tokens_per_s'][name]:,.0f} | |")
    rows.append(f"| Lightning / plain loop (dense) | {wall['lightning_over_plain']:.3f} | "
                f"{cpu['lightning_over_plain']:.3f} | >= 0.97 |")
    rows.append(f"| step-time saving, ILD p_max 0.4 constant | {wall['realized_saving']:.1%} | "
                f"{cpu['realized_saving']:.1%} | |")
    rows.append(f"| theoretical saving (FLOPs of the drawn masks) | {result['theoretical_saving']:.1%} | "
                f"{result['theoretical_saving']:.1%} | |")
    rows.append(f"| realized / theoretical | {wall['realized_over_theoretical']:.2f} | "
                f"{cpu['realized_over_theoretical']:.2f} | >= 0.9 |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = summarise(args, measure(args))
    write_results(args.out, result)
    print(table(result))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
