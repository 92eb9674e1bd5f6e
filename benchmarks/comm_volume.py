"""Bytes every collective moves in one training micro-batch (forward + backward), per
GPU, for DDP, FSDP2 and HSDP, computed from the model's parameter shapes and the
mixed-precision policy; written as JSON and a markdown table.

    python benchmarks/comm_volume.py                      # paper sizes, 2 nodes x 8 GPUs
    python benchmarks/comm_volume.py --nodes 4 --gpus-per-node 8 --sizes 3.9B 8.2B
    python benchmarks/comm_volume.py --verify             # + a 4-process CPU run that
                                                          #   counts what really moves

What FSDP2 does per micro-batch (framework/strategies/parallelize.py: ``fully_shard`` per block,
then the root = embedding + final norm + head, the root kept gathered after forward):

    all-gather      each block twice (forward, and again in backward: blocks reshard
                    after forward), the root once; buffer = the group's parameters,
                    each padded on dim 0 to a multiple of the shard group, in param_dtype
    reduce-scatter  each group once, the same padded buffer, in reduce_dtype
    all-reduce      HSDP only: each group's gradient shard (buffer / shard size) across
                    the replicas, in reduce_dtype
    DDP             one all-reduce of every gradient (float32), in ~25 MB buckets
    every step      the non-finite guard's all-gather of 2 float32 flags per rank
                    (``optimizer_step_collectives``; not in the per-micro-batch table)

Per-GPU traffic is what a ring (NCCL's algorithm for these sizes) sends and receives
per GPU: (n-1)/n of the buffer for an all-gather or reduce-scatter over n ranks,
2(n-1)/n for an all-reduce. A collective whose group spans nodes is limited by the
inter-node network: divide its traffic by your per-GPU inter-node bandwidth (e.g. 50
GB/s for one 400 Gb/s NIC per GPU); a group inside a node runs over NVLink.
Gradient accumulation repeats all of this every micro-batch (Lightning does not skip
FSDP2's reduce-scatter while accumulating).

``--verify`` runs the tiny model of ``VERIFY_MODEL`` through ``parallelize`` on 4 CPU
processes over gloo (FSDP2 over 4 in float32 and bf16, HSDP 2 x 2 in bf16), records
every collective the c10d dispatcher sees during one forward + backward with layer
dropout (zero-row blocks included), and checks op, dtype, group size and bytes
against this arithmetic. tests/distributed checks the same against real
`layerdrop pretrain` runs. (torch's CommDebugMode counts calls only, not bytes or dtypes.)
"""

from __future__ import annotations

import argparse
import datetime
import math
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

try:  # run as a script: the harness puts the repository's packages on the path first
    from harness import RESULTS, write_results
except ModuleNotFoundError:  # imported as benchmarks.comm_volume (the rank probe inside a launched run)
    from benchmarks.harness import RESULTS, write_results
from framework.config import LLAMA3_VOCAB_SIZE, PAPER_SIZES, ModelConfig  # noqa: E402

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
SHORT = {"float32": "fp32", "bfloat16": "bf16"}
DDP_BUCKET_BYTES = 25 * 2**20
# The setups of the table: (name, strategy, param_dtype, reduce_dtype).
SETUPS = (("ddp", "ddp", "float32", "float32"),
          ("fsdp fp32", "fsdp", "float32", "float32"),
          ("fsdp bf16", "fsdp", "bfloat16", "float32"),
          ("hsdp bf16", "hsdp", "bfloat16", "float32"))
VERIFY_MODEL = dict(vocab_size=64, d_model=16, n_layers=3, n_heads=2, max_seq_len=8, attention="sdpa")


@dataclass(frozen=True)
class Collective:
    """One kind of collective of one micro-batch, as one rank sees it."""

    op: str            # all_gather | reduce_scatter | all_reduce
    unit: str          # "block" (one of n_layers) | "root" | "all" (DDP)
    count: int         # calls per micro-batch
    group_size: int    # ranks in the collective's group
    dtype: str
    buffer_bytes: int  # the full buffer of one call (all-gather output, reduce-scatter input)
    spans_nodes: bool

    @property
    def traffic_bytes(self) -> float:
        """Bytes one GPU sends (and receives) over all ``count`` calls, ring algorithm."""
        n = self.group_size
        factor = 2 * (n - 1) / n if self.op == "all_reduce" else (n - 1) / n
        return self.count * factor * self.buffer_bytes


def parameter_groups(cfg: ModelConfig) -> dict[str, list[tuple[int, ...]]]:
    """FSDP2's units: "block" (the shapes of one block) and "root" (the rest)."""
    from framework.families.registry import build_decoder

    with torch.device("meta"):
        decoder = build_decoder(cfg)  # the config's family: its parameter shapes
    groups: dict[str, list[tuple[int, ...]]] = {"block": [], "root": []}
    for name, param in decoder.named_parameters():
        if name.startswith("blocks.0."):
            groups["block"].append(tuple(param.shape))
        elif not name.startswith("blocks."):
            groups["root"].append(tuple(param.shape))
    return groups


def padded_numel(shapes: list[tuple[int, ...]], shard: int) -> int:
    """Elements of a group's all-gather buffer: FSDP2 pads each parameter's dim 0 to a
    multiple of the shard group size."""
    return sum(math.ceil(shape[0] / shard) * shard * math.prod(shape[1:]) for shape in shapes)


def micro_batch_collectives(cfg: ModelConfig, strategy: str, *, nodes: int, gpus_per_node: int,
                            param_dtype: str = "float32", reduce_dtype: str = "float32",
                            shard_size: int | None = None) -> list[Collective]:
    """Every collective of one forward + backward, per rank."""
    world = nodes * gpus_per_node
    groups = parameter_groups(cfg)
    if strategy == "ddp":
        total = sum(math.prod(s) for s in groups["root"]) + cfg.n_layers * sum(math.prod(s) for s in groups["block"])
        return [Collective("all_reduce", "all", math.ceil(total * 4 / DDP_BUCKET_BYTES), world, "float32",
                           total * 4 // math.ceil(total * 4 / DDP_BUCKET_BYTES), nodes > 1)]
    shard = world if strategy == "fsdp" else (shard_size or gpus_per_node)
    replicas = world // shard
    shard_spans_nodes = shard > gpus_per_node
    rows = []
    for unit, count, gathers in (("block", cfg.n_layers, 2), ("root", 1, 1)):
        numel = padded_numel(groups[unit], shard)
        rows.append(Collective("all_gather", unit, count * gathers, shard, param_dtype,
                               numel * DTYPE_BYTES[param_dtype], shard_spans_nodes))
        rows.append(Collective("reduce_scatter", unit, count, shard, reduce_dtype,
                               numel * DTYPE_BYTES[reduce_dtype], shard_spans_nodes))
        if replicas > 1:
            rows.append(Collective("all_reduce", unit, count, replicas, reduce_dtype,
                                   numel // shard * DTYPE_BYTES[reduce_dtype], True))
    return rows


def optimizer_step_collectives(*, nodes: int, gpus_per_node: int) -> list[Collective]:
    """Every collective of one optimizer step outside forward + backward, per rank: the
    non-finite guard's all-gather of two float32 flags per rank (framework/training/nonfinite.py),
    whatever the strategy."""
    world = nodes * gpus_per_node
    return [Collective("all_gather", "guard", 1, world, "float32", world * 2 * 4, nodes > 1)]


def summary(rows: list[Collective]) -> dict[str, float]:
    """Per-GPU traffic of one micro-batch, inside a node and across nodes."""
    across = sum(r.traffic_bytes for r in rows if r.spans_nodes)
    within = sum(r.traffic_bytes for r in rows if not r.spans_nodes)
    return {"traffic_within_node_bytes": within, "traffic_across_nodes_bytes": across,
            "traffic_total_bytes": within + across}


def table(sizes: list[str], nodes: int, gpus_per_node: int) -> tuple[list[dict[str, Any]], str]:
    records, lines = [], [
        "| size | setup | all-gather per block | reduce-scatter per block | all-reduce per block (replicas) "
        "| root all-gather (embedding + head) | per GPU within a node | per GPU across nodes |",
        "|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        cfg = ModelConfig(vocab_size=LLAMA3_VOCAB_SIZE, **PAPER_SIZES[size])
        for name, strategy, param_dtype, reduce_dtype in SETUPS:
            rows = micro_batch_collectives(cfg, strategy, nodes=nodes, gpus_per_node=gpus_per_node,
                                           param_dtype=param_dtype, reduce_dtype=reduce_dtype)
            totals = summary(rows)
            records.append({"size": size, "setup": name, "strategy": strategy, "param_dtype": param_dtype,
                            "reduce_dtype": reduce_dtype,
                            "collectives": [asdict(r) | {"traffic_bytes": r.traffic_bytes} for r in rows], **totals})
            calls = {(r.unit, r.op): r for r in rows}
            cells = [f"{_mb(calls[key].buffer_bytes)} {SHORT[calls[key].dtype]}" if key in calls else "—"
                     for key in (("block", "all_gather"), ("block", "reduce_scatter"), ("block", "all_reduce"),
                                 ("root", "all_gather"))]
            if strategy == "ddp":
                cells = ["—", "—", f"{_gb(rows[0].buffer_bytes * rows[0].count)} fp32 (every gradient)", "—"]
            lines.append(f"| {size} | {name} | {' | '.join(cells)} | {_gb(totals['traffic_within_node_bytes'])} "
                         f"| {_gb(totals['traffic_across_nodes_bytes'])} |")
    return records, "\n".join(lines)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB" if n else "0"


# ----------------------------------------------------------- what really moves


class CollectiveLog(TorchDispatchMode):
    """Records every c10d collective dispatched while active: op, dtype, the full
    buffer's elements (all-gather output, reduce-scatter input, all-reduce tensors)
    and the group size."""

    OPS = {"_allgather_base_": "all_gather", "_reduce_scatter_base_": "reduce_scatter", "allreduce_": "all_reduce"}

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func.namespace == "c10d":
            self.calls.append(self._describe(func.__name__.split(".")[0], args))
        return func(*args, **(kwargs or {}))

    def _describe(self, name: str, args: tuple) -> dict[str, Any]:
        import torch.distributed as dist

        group = next((a for a in args if type(a).__name__ == "ScriptObject"), None)
        size = dist.ProcessGroup.unbox(group).size() if group is not None else None
        tensors = [t for t in torch.utils._pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]
        if name == "_allgather_base_":
            buffer, dtype = tensors[0], tensors[1].dtype  # (output, input)
        elif name == "_reduce_scatter_base_":
            buffer, dtype = tensors[1], tensors[1].dtype  # (output, input)
        else:
            buffer, dtype = tensors[0], tensors[0].dtype
        numel = sum(t.numel() for t in tensors) if name == "allreduce_" else buffer.numel()
        return {"op": self.OPS.get(name, name), "dtype": str(dtype).removeprefix("torch."), "group_size": size,
                "buffer_bytes": numel * buffer.element_size()}


def expected_calls(rows: list[Collective]) -> Counter:
    """The multiset of (op, dtype, group size, bytes) ``CollectiveLog`` should record."""
    return Counter({(r.op, r.dtype, r.group_size, r.buffer_bytes): r.count for r in rows})


def recorded_calls(calls: list[dict[str, Any]]) -> Counter:
    return Counter((c["op"], c["dtype"], c["group_size"], c["buffer_bytes"]) for c in calls)


def _verify_rank(rank: int, world: int, port: int, queue: Any) -> None:
    import os

    import torch.distributed as dist

    from framework.config import LayerDropoutConfig
    from framework.layer_dropout import StepKey, plan
    from framework.model.loss import chunked_cross_entropy
    from framework.families.registry import build_decoder
    from framework.strategies import mixed_precision_policy, parallelize
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = ModelConfig(**VERIFY_MODEL)
    results = []
    for name, strategy, param_dtype, reduce_dtype in SETUPS[1:] + (("hsdp fp32", "hsdp", "float32", "float32"),):
        torch.manual_seed(0)
        decoder = build_decoder(cfg)
        mesh = (init_device_mesh("cpu", (world,), mesh_dim_names=("data_parallel",)) if strategy == "fsdp" else
                init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard")))
        parallelize(decoder, device_mesh=mesh, mp_policy=mixed_precision_policy(param_dtype, reduce_dtype),
                    activation_checkpointing=True)
        tokens = torch.randint(0, cfg.vocab_size, (4, cfg.max_seq_len + 1))
        dropout = LayerDropoutConfig(p_max=0.99, distribution="uniform", schedule="constant")
        drop = plan(dropout, [0.25, 0.99, 0.5], 4, StepKey(0, rank, 0))  # some rows, and (mostly) none
        log = CollectiveLog()
        with log:
            hidden = decoder.hidden(tokens[:, :-1], plan=drop)
            chunked_cross_entropy(hidden, tokens[:, 1:], decoder.logits, chunk_tokens=8).backward()
        rows = micro_batch_collectives(cfg, strategy, nodes=2, gpus_per_node=world // 2,
                                       param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        results.append({"setup": name, "kept_rows": [len(layer.attn_rows) for layer in drop.layers],
                        "recorded": log.calls, "matches": recorded_calls(log.calls) == expected_calls(rows),
                        "expected": [asdict(r) for r in rows]})
    dist.destroy_process_group()
    if rank == 0:
        queue.put(results)


def verify(world: int = 4) -> list[dict[str, Any]]:
    """Run ``_verify_rank`` on ``world`` CPU processes; rank 0's findings."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(_verify_rank, args=(world, port, queue), nprocs=world, start_method="spawn")
    return queue.get()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(PAPER_SIZES), choices=list(PAPER_SIZES))
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--verify", action="store_true", help="also count real collectives on 4 CPU processes")
    parser.add_argument("--out", type=Path, default=RESULTS / "comm_volume.json")
    args = parser.parse_args(argv)
    for name in ("nodes", "gpus_per_node"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} is invalid: must be >= 1")
    records, markdown = table(args.sizes, args.nodes, args.gpus_per_node)
    result: dict[str, Any] = {"date": datetime.date.today().isoformat(), "nodes": args.nodes,
                              "gpus_per_node": args.gpus_per_node, "unit": "one micro-batch (forward + backward)",
                              "rows": records, "table": markdown}
    if args.verify:
        checks = verify()
        result["verified_on_cpu"] = [{k: v for k, v in c.items() if k != "expected"} for c in checks]
        for check in checks:
            print(f"verify {check['setup']}: {len(check['recorded'])} collectives recorded, "
                  f"{'match' if check['matches'] else 'MISMATCH'} the arithmetic")
        if not all(c["matches"] for c in checks):
            args.out.parent.mkdir(parents=True, exist_ok=True)
            write_results(args.out.with_suffix(".mismatch.json"), checks)
            print("error: the recorded collectives differ from the arithmetic", file=sys.stderr)
            return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, result)
    print(markdown)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
