"""Test helpers: a tiny recipe (for tests/conftest.py's prepared tokens), and
`layerdrop pretrain` launched as real processes with a hard time limit (a hang becomes
a failure, never a stuck suite).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.helpers.tiny_training import prepare_tiny_data, shared_once  # noqa: F401  (for the distributed tests)

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LAUNCH_TIMEOUT_S = 420  # generous for 2 loaded cores; a healthy launch takes ~1 min
VOCAB, SEQ_LEN, MICRO_BATCH, LAYERS = 512, 32, 4, 4
STEPS, P_MAX = 30, 0.99  # the reference runs: ≥ 30 steps at p_max = 0.99
NODES_STEPS = 20  # the 2 nodes x 2 devices runs (DDP reference, HSDP)
POISONED_STEP = 2  # their step with a non-finite gradient on one rank
EXITS = {"scale": 0.5, "curriculum": "rotational", "weighting": "linear"}  # exits 1, 2, 3: {1, 3}, {2}, ...
# The Llama family (framework/families) in the runs that use it: grouped-query attention and
# tied embeddings, the SmolLM / Llama-3.2-1B layout (the HSDP and nodes-DDP runs here, ZeRO-3's
# checkpoint-forms run untied).
LLAMA = {"family": "llama", "bias": False, "n_kv_heads": 2, "tie_embeddings": True}


def tiny_recipe(path: Path, *, data_dir: Path, root: Path, strategy: Any, steps: int = 30, devices: int = 2,
                num_nodes: int = 1, p_max: float = 0.99, distribution: str = "uniform",
                schedule: str = "constant", probe_dir: Path | None = None, save_parameters: bool = False,
                activation_checkpointing: bool = False, every_n_steps: int = 1000,
                val_check_interval: int | None = None, record_collectives: bool = False,
                early_exit_loss: dict[str, Any] | None = None, logits_out: Path | None = None,
                callbacks: list[dict[str, Any]] = (), decoder: dict[str, Any] | None = None) -> Path:
    """A recipe for the tiny model (d=32, L=4, vocab 512, seq 32, micro-batch 4), written to
    ``path``. ``logits_out``: the live model's logits at the end (logits_probe.LogitsProbe);
    ``callbacks``: more trainer callbacks (class paths); ``decoder``: changes to the model's
    decoder settings (e.g. ``LLAMA``)."""
    trainer: dict[str, Any] = {
        "accelerator": "cpu", "devices": devices, "num_nodes": num_nodes, "strategy": strategy,
        "precision": "32-true", "max_steps": steps, "log_every_n_steps": 5, "default_root_dir": str(root),
        "enable_progress_bar": False, "enable_model_summary": False, "limit_val_batches": 2,
        "val_check_interval": val_check_interval or steps, "check_val_every_n_epoch": None,
    }
    if probe_dir is not None:
        trainer["callbacks"] = [{"class_path": "rank_probe.RankProbe",
                                 "init_args": {"out_dir": str(probe_dir), "save_parameters": save_parameters,
                                               "record_collectives": record_collectives}}]
    if logits_out is not None:
        trainer.setdefault("callbacks", []).append({"class_path": "logits_probe.LogitsProbe",
                                                    "init_args": {"out": str(logits_out)}})
    if callbacks:
        trainer.setdefault("callbacks", []).extend(callbacks)
    recipe = {
        "seed_everything": 1234,
        "trainer": trainer,
        "model": {
            "decoder": {"vocab_size": VOCAB, "d_model": 32, "n_layers": LAYERS, "n_heads": 4, "max_seq_len": SEQ_LEN,
                        "attention": "sdpa", **(decoder or {})},
            "layer_dropout": {"p_max": p_max, "distribution": distribution, "schedule": schedule, "seed": 0},
            "activation_checkpointing": activation_checkpointing,
            **({"early_exit_loss": early_exit_loss} if early_exit_loss else {}),
        },
        "data": {"data_dir": str(data_dir), "seq_len": SEQ_LEN, "batch_size": MICRO_BATCH, "num_workers": 0,
                 "val_batches": 2},
        "checkpoint": {"every_n_steps": every_n_steps, "keep_last": 3},
    }
    path.write_text(json.dumps(recipe, indent=2))  # JSON is YAML: LightningCLI reads it as a recipe
    return path


def ddp_reference_recipe(out: Path, data: Path, **changes: Any) -> Path:
    """The DDP reference run the tests share, and the runs of other strategies that
    compare with it: uniform p_max = 0.99, constant schedule, the early-exit loss on
    (``EXITS``), 30 steps, a checkpoint at step 15, the parameters saved per rank."""
    settings = dict(data_dir=data, root=out / "run", strategy="ddp", steps=STEPS, p_max=P_MAX,
                    distribution="uniform", schedule="constant", probe_dir=out / "probe", save_parameters=True,
                    every_n_steps=STEPS // 2, early_exit_loss=EXITS)
    return tiny_recipe(out / "recipe.json", **{**settings, **changes})


def nodes_recipe(out: Path, data: Path, strategy: Any, **changes: Any) -> Path:
    """2 nodes x 2 devices, the Llama family (``LLAMA``: GQA, tied embeddings), uniform
    p_max = 0.99, the early-exit loss on (``EXITS``), 20 steps, a checkpoint at step 10,
    the parameters saved per rank; an infinite gradient
    on global rank 1 alone at step ``POISONED_STEP`` (every rank must skip that step),
    and every rank's loss and weights per step in ``out/records``."""
    poison = [{"class_path": "crash_points.PoisonGradient", "init_args": {"step": POISONED_STEP, "rank": 1}},
              {"class_path": "crash_points.RecordLosses", "init_args": {"out_dir": str(out / "records")}}]
    settings = dict(data_dir=data, root=out / "run", strategy=strategy, steps=NODES_STEPS, devices=2, num_nodes=2,
                    p_max=P_MAX, probe_dir=out / "probe", save_parameters=True, every_n_steps=NODES_STEPS // 2,
                    early_exit_loss=EXITS, callbacks=poison, decoder=LLAMA)
    return tiny_recipe(out / "recipe.json", **{**settings, **changes})


def pretrain_command(recipe: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "framework.cli", "pretrain", "--config", str(recipe), *extra]


def torchrun_node(node_rank: int, nnodes: int, port: int, recipe: Path, *extra: str, devices: int = 1,
                  strategy: str = "ddp") -> tuple[list[str], dict]:
    """One "node" of a multi-node CPU launch through recipes/launch/torchrun.sh (torchrun
    with a static rendezvous on loopback, ``devices`` processes per node)."""
    env = {**clean_env(), "NNODES": str(nnodes), "NODE_RANK": str(node_rank), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "GPUS_PER_NODE": str(devices), "ACCELERATOR": "cpu", "STRATEGY": strategy,
           "PYTHON": sys.executable}
    return ["bash", str(REPO / "recipes" / "launch" / "torchrun.sh"), str(recipe), *extra], env


def launch_nodes(recipe: Path, log_dir: Path, *extra: str, nnodes: int = 2, devices: int = 1,
                 strategy: str = "ddp") -> list[str]:
    """Start ``nnodes`` torchrun "nodes" on loopback and wait for all of them; their outputs.
    If one fails or hangs, the others are killed rather than left waiting."""
    port = free_port()
    logs = [log_dir / f"node{node}.log" for node in range(nnodes)]
    processes = []
    for node in range(nnodes):
        command, env = torchrun_node(node, nnodes, port, recipe, *extra, devices=devices, strategy=strategy)
        processes.append(start(command, logs[node], env))
    try:
        return [finish(process, log) for process, log in zip(processes, logs)]
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)


def clean_env() -> dict[str, str]:
    """The parent's environment without a distributed context, with the probes importable."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK",
                        "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "PYTEST_XDIST_WORKER")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["OMP_NUM_THREADS"] = "1"  # two ranks on two cores: no oversubscription
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``command`` in its own process group (so its ranks can be killed together)."""
    with open(log, "w") as handle:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, cwd=REPO, env=env or clean_env(), stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True)


def finish(process: subprocess.Popen, log: Path, timeout: float = LAUNCH_TIMEOUT_S) -> str:
    """Wait for ``process``; a time-out kills its whole group and fails with the log's tail."""
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise AssertionError(f"timed out after {timeout:.0f} s (a hang?): {tail(log)}") from None
    finally:
        _kill_group_leftovers(process.pid)
    output = log.read_text(errors="replace")
    if code != 0:
        raise AssertionError(f"exit code {code}: {tail(log)}")
    return output


def run(command: list[str], log: Path | None = None, timeout: float = LAUNCH_TIMEOUT_S) -> str:
    log = log or Path(os.devnull)
    if log == Path(os.devnull):
        completed = subprocess.run(command, cwd=REPO, env=clean_env(), capture_output=True, text=True,
                                   timeout=timeout)
        if completed.returncode != 0:
            raise AssertionError(f"{' '.join(command[:5])} failed: {completed.stderr[-3000:]}")
        return completed.stdout
    return finish(start(command, log), log, timeout)


def _kill_group_leftovers(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)  # ranks a crashed launcher left behind
    except ProcessLookupError:
        pass


def tail(log: Path, chars: int = 4000) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return text[-chars:]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def read_ranks(probe_dir: Path, world_size: int) -> list[dict[str, Any]]:
    return [json.loads((probe_dir / f"rank{r}.json").read_text()) for r in range(world_size)]
