"""`layerdrop sweep SWEEP.yaml`: run a grid of pretraining runs and their evaluations.

    layerdrop sweep recipes/sweeps/paper-cpu.yaml --out sweeps/paper-cpu --dry-run
    layerdrop sweep recipes/sweeps/paper-cpu.yaml --out sweeps/paper-cpu --jobs 2 --threads-per-job 1
    layerdrop sweep recipes/sweeps/paper-gpu.yaml --out /shared/paper-gpu --slurm   # writes a job array

Each run is `layerdrop pretrain --config <run>/config.yaml --resume auto`, then each
evaluation `layerdrop <command> --ckpt <run>/checkpoints/last.ckpt --data <data> --out
<run>/evals/<name>.json`, as subprocesses. Locally, ``--jobs`` runs at a time, each with
``--threads-per-job`` threads (OMP_NUM_THREADS), in a plain process pool; on a cluster,
``--slurm`` writes one SLURM array task per run, each launching its training through
recipes/launch/slurm.sbatch (so a run may itself span nodes) and then its evaluations.

The sweep folder:

    <out>/sweep.yaml                   the sweep file as last run
    <out>/runs/<run>/recipe.yaml       base recipe + the run's overrides (what was asked)
    <out>/runs/<run>/config.yaml       the resolved config (`pretrain --print_config`),
                                       written before the run starts; what it runs
    <out>/runs/<run>/summary.json      written by the run when training finished
    <out>/runs/<run>/evals/<name>.json one per evaluation
    <out>/runs/<run>/status.json       state, return codes, CPU and wall seconds per stage (a
                                       running stage's so far as in_flight: attempt_meter.py)
    <out>/runs/<run>/logs/*.log        each subprocess's output (appended across attempts)

Resumable and idempotent: a run whose summary and evaluations exist is skipped (here, or
in a committed report's runs/ copy named by ``--done-from``: eval/experiments/sweep/adoption.py);
one with a checkpoint but no summary continues from it (`--resume auto`); a missing
evaluation runs alone. A failed run is reported (status.json, the tail of its log) and the others
go on; the exit status is 1 when any failed. Running again retries what failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from eval.experiments.sweep.attempt_meter import AttemptMeter, stage_entry
from eval.experiments.sweep.run_folder import RunFolder, layerdrop
from eval.experiments.sweep.adoption import adopt_finished, finished_elsewhere, without_machine_paths
from eval.experiments.sweep.dry_run import dry_run
from eval.experiments.sweep.spec import EvalSpec, Run, Sweep, SweepError, get_dotted, load_sweep, predict, run_recipe
from eval.experiments.sweep.status import StatusPrinter
from eval.experiments.sweep.slurm import check_slurm_options, write_slurm
from eval.options import check_positive
from framework.files.atomic_write import write_json, write_text
from framework.files.run_lock import RunFolderInUse, RunLock
from framework.command_parser import CommandParser

PROG = "layerdrop sweep"
STOPPED = 128 + signal.SIGTERM
LAUNCH_SCRIPT = Path(__file__).resolve().parents[3] / "recipes" / "launch" / "slurm.sbatch"


class Runner:
    """Runs the stages of runs as subprocesses; one instance per sweep invocation."""

    def __init__(self, sweep: Sweep, root: Path, *, threads: int | None, launcher: str = "local") -> None:
        self.sweep, self.root, self.threads, self.launcher = sweep, root, threads, launcher
        self.children: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.stopping = False
        self.training: dict[str, Path] = {}  # run name -> its pretrain log, while it trains
        self.wait_seconds = 5.0  # between looks at a run folder another process holds
        self.meter_seconds = 30.0  # between writes of a running stage's CPU time (attempt_meter.py)

    # -- environment and subprocesses ------------------------------------------------
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.threads:
            for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                env[name] = str(self.threads)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # spinning threads steal a shared machine's cores
        return env

    def spawn(self, argv: list[str], env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen | None:
        """Start a child the stop handler knows about; None once the sweep is stopping."""
        with self.lock:
            if self.stopping:
                return None
            child = subprocess.Popen(argv, env=env or self.env(), **popen)
            self.children.add(child)
            return child

    def reap(self, child: subprocess.Popen, meter: AttemptMeter | None = None) -> float:
        """Wait for a child; its own CPU seconds (getrusage of all children would mix runs).
        It leaves the stop handler's set (and its meter stops) before it is reaped: until then
        its pid cannot be reused, so neither a stop nor the meter ever touches another process."""
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        if meter is not None:
            meter.stop()
        with self.lock:
            self.children.discard(child)
            _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        return usage.ru_utime + usage.ru_stime

    def call(self, argv: list[str], log: Path, env: dict[str, str] | None = None,
             progress: Callable[[float, float], None] | None = None) -> tuple[int, float, float]:
        """Run ``argv`` with its output appended to ``log``: (return code, CPU s, wall s);
        ``progress(cpu, wall)`` every ``meter_seconds`` while it runs."""
        log.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with open(log, "a") as out:
            out.write(f"\n$ {shlex.join(argv)}\n")
            out.flush()
            child = self.spawn(argv, env, stdout=out, stderr=subprocess.STDOUT)
            if child is None:
                return STOPPED, 0.0, 0.0
            meter = AttemptMeter(child.pid, progress, self.meter_seconds).start() if progress else None
            cpu = self.reap(child, meter)
        return child.returncode, cpu, time.monotonic() - start

    def stop(self) -> None:
        """Forward a stop to every running child (pretrain saves nothing extra: its last
        periodic checkpoint is what a resumed run continues from)."""
        with self.lock:
            self.stopping = True
            for child in self.children:
                try:
                    os.kill(child.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    # -- stages ------------------------------------------------------------------------
    def write_config(self, folder: RunFolder) -> str | None:
        """recipe.yaml, then config.yaml from `pretrain --print_config` (which validates
        every key and value before anything trains). Returns an error line or None."""
        recipe = run_recipe(self.sweep, folder.run, folder.dir.resolve())
        text = yaml.safe_dump(recipe, sort_keys=False)
        if folder.recipe.is_file() and folder.recipe.read_text() != text:
            if without_machine_paths(yaml.safe_load(folder.recipe.read_text()) or {}) != without_machine_paths(recipe):
                return (f"{folder.recipe} holds a different recipe than this sweep asks for: the sweep file changed "
                        "for an existing run; restore it, or use another --out")
            # The same run, moved (the sweep folder or the data): its config names the old
            # place, so it is resolved again from the recipe with the new paths.
            folder.config.unlink(missing_ok=True)
        folder.dir.mkdir(parents=True, exist_ok=True)
        write_text(folder.recipe, text)
        if folder.config.is_file():
            return None
        partial = folder.config.with_name(f".{folder.config.name}.partial")
        log = folder.log("config")
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "w") as out, open(log, "a") as errors:
            child = self.spawn([*layerdrop(), "pretrain", "--config", str(folder.recipe), "--print_config"],
                               stdout=out, stderr=errors)
            if child is None:
                return "stopped"
            self.reap(child)
        if child.returncode != 0:
            partial.unlink(missing_ok=True)
            return "stopped" if self.stopping else "invalid recipe: " + last_line(tail(log))
        header = f"# resolved config of sweep run {folder.run.name} ({self.sweep.path})\n"
        write_text(folder.config, header + partial.read_text())
        partial.unlink()
        return None

    def train_argv(self, folder: RunFolder) -> tuple[list[str], dict[str, str]]:
        env = self.env()
        if self.launcher == "slurm-task":
            # A run may span the nodes of its allocation: the launch script srun's the tasks.
            config = yaml.safe_load(folder.config.read_text())
            env["STRATEGY"] = str(get_dotted(config, "trainer.strategy", "fsdp"))
            return ["bash", str(LAUNCH_SCRIPT), str(folder.config)], env
        return [*layerdrop(), "pretrain", "--config", str(folder.config), "--resume", "auto",
                "--trainer.enable_progress_bar", "false"], env

    def eval_argv(self, folder: RunFolder, spec: EvalSpec) -> list[str]:
        fill = {"run_dir": str(folder.dir), "ckpt": str(folder.checkpoint), "data": str(self.sweep.data_dir)}
        argv = [*layerdrop(), *spec.command.split(), "--ckpt", str(folder.checkpoint)]
        if spec.data:
            argv += ["--data", str(self.sweep.data_dir)]
        argv += ["--out", str(folder.eval_out(spec))]
        return argv + cli_args(spec.args, fill)

    def run(self, run: Run) -> dict:
        """Every missing stage of one run; returns its status."""
        folder = RunFolder(self.root, run)
        stopped = {"run": run.name, "state": "stopped", "error": "not started: the sweep was stopped"}
        lock = self.hold(folder) if not self.stopping else None
        if lock is None:
            return stopped
        try:
            # Read under the lock: another process may have run (or finished) it meanwhile.
            status = {**folder.status(), "run": run.name, "config": run.config_name, "seed": run.seed}
            status.setdefault("stages", {})
            return self._run_stages(folder, status)
        finally:
            lock.release()

    def hold(self, folder: RunFolder) -> RunLock | None:
        """The run folder's lock (framework/files/run_lock.py): a run another process is
        running (a second sweep sharing the folder, a `pretrain` by hand) is waited for,
        then continued from what it left. None when the sweep is stopped meanwhile."""
        said = False
        while not self.stopping:
            lock = RunLock(folder.dir, "sweep")
            try:
                note = lock.acquire()
            except RunFolderInUse as busy:
                if not said:
                    print(f"{folder.run.name}: waiting: {busy}", flush=True)
                    said = True
                time.sleep(self.wait_seconds)
                continue
            if note:
                print(f"{folder.run.name}: note: {note}", flush=True)
            return lock
        return None

    def _run_stages(self, folder: RunFolder, status: dict) -> dict:
        def metered(stage: str) -> Callable[[float, float], None]:
            entry = stage_entry(status, stage)  # a killed attempt's in_flight counts from here on

            def write(cpu: float, wall: float) -> None:
                entry["in_flight"] = {"cpu_seconds": round(cpu, 3), "wall_seconds": round(wall, 3)}
                write_json(folder.status_file, status)
            return write

        def record(stage: str, code: int, cpu: float, wall: float) -> None:
            status["stages"].get(stage, {}).pop("in_flight", None)  # this attempt's own: its rusage replaces it
            entry = stage_entry(status, stage)
            entry["cpu_seconds"] += cpu
            entry["wall_seconds"] += wall
            entry["attempts"] += 1
            entry["returncode"] = code
            write_json(folder.status_file, status)

        def fail(stage: str, error: str) -> dict:
            # A stop asked for (SIGTERM/SIGINT to the sweep) is not a failure: the run resumes.
            status.update(state="stopped" if self.stopping else "failed", failed_stage=stage, error=error)
            write_json(folder.status_file, status)
            return status

        error = self.write_config(folder)
        if error:
            return fail("config", error)
        status.update(state="running", error=None, failed_stage=None)
        write_json(folder.status_file, status)
        if not folder.summary.is_file():
            argv, env = self.train_argv(folder)
            with self.lock:
                self.training[folder.run.name] = folder.log("pretrain")
            try:
                code, cpu, wall = self.call(argv, folder.log("pretrain"), env, metered("pretrain"))
            finally:
                with self.lock:
                    self.training.pop(folder.run.name, None)
            record("pretrain", code, cpu, wall)
            if code != 0 or not folder.summary.is_file():
                return fail("pretrain", f"exit status {code}: {last_line(tail(folder.log('pretrain')))}")
        for spec in self.sweep.evals:
            if not spec.applies_to(folder.run.name) or folder.eval_out(spec).exists():
                continue
            code, cpu, wall = self.call(self.eval_argv(folder, spec), folder.log(spec.name),
                                        progress=metered(spec.name))
            record(spec.name, code, cpu, wall)
            if code != 0:
                return fail(spec.name, f"exit status {code}: {last_line(tail(folder.log(spec.name)))}")
        status.update(state="done")
        write_json(folder.status_file, status)
        return status


# ------------------------------------------------------------------------ helpers
def cli_args(args: dict[str, Any], fill: dict[str, str]) -> list[str]:
    """{"max-tokens": 1000, "sweep": [middle, single], "adaptive": true} -> CLI words;
    ``{run_dir}``, ``{ckpt}``, ``{data}`` in strings are filled in."""
    words: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            words += [flag, *(str(v).format(**fill) for v in value)]
        else:
            words += [flag, str(value).format(**fill)]
    return words


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error") or "Error" in line]
    return (errors or lines or ["(no output)"])[-1][:300]


def machine_info() -> dict:
    """Where the sweep ran (for the report): CPU model, cores, memory, versions."""
    import platform

    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    except (OSError, ValueError):
        memory = None
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {"host": {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": memory, "gpus": gpus},
            "python": platform.python_version(), "torch": torch.__version__}


def record_invocation(root: Path, argv: list[str], args: argparse.Namespace, prog: str = PROG) -> None:
    """<out>/machine.json: the machine and every distinct command that ran this sweep."""
    path = root / "machine.json"
    record = json.loads(path.read_text()) if path.is_file() else {}
    command = shlex.join([*prog.split(), *argv])
    record.update(machine_info(), jobs=args.jobs, threads_per_job=args.threads_per_job)
    record["commands"] = list(dict.fromkeys([*record.get("commands", []), command]))
    write_json(path, record)


def prepare_data(sweep: Sweep, runner: Runner) -> None:
    if (sweep.data_dir / "manifest.json").is_file():
        return
    if not sweep.prepare:
        raise SweepError(f"data folder {str(sweep.data_dir)!r} has no manifest.json and the sweep file gives no "
                         "data.prepare arguments: prepare it with `layerdrop prepare ... --out DIR` first")
    log = sweep.data_dir.parent / f"{sweep.data_dir.name}.prepare.log"
    print(f"preparing {sweep.data_dir} (log: {log})", flush=True)
    code, _, _ = runner.call([*layerdrop(), "prepare", *sweep.prepare, "--out", str(sweep.data_dir)], log)
    if code != 0:
        raise SweepError(f"`layerdrop prepare` failed with exit status {code}: {last_line(tail(log))}")


# ------------------------------------------------------------------------------ CLI
def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=PROG, description="Run a sweep of pretraining runs and their "
                                     "evaluations (locally in a process pool, or as a SLURM job array).")
    parser.add_argument("sweep", metavar="SWEEP.yaml", help="the sweep file (see recipes/sweeps/)")
    add_run_options(parser, jobs="runs at a time (locally; on SLURM: the array's concurrency limit) (default 1)")
    parser.add_argument("--only", nargs="+", default=None, metavar="GLOB",
                        help="only the runs whose names match (e.g. 'dense,*')")
    parser.add_argument("--dry-run", action="store_true",
                        help="list the runs with predicted P̄, FLOPs saved and compute, and their state; run nothing")
    parser.add_argument("--flops-per-second", type=float, default=None,
                        help="with --dry-run: also convert the total compute to hours at this rate")
    parser.add_argument("--slurm", action="store_true", help="write <out>/slurm/array.sbatch (one task per run) "
                        "instead of running")
    parser.add_argument("--slurm-nodes", type=int, default=1, help="nodes per run (default 1)")
    parser.add_argument("--slurm-gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    parser.add_argument("--slurm-time", default="24:00:00", help="time limit per run (default 24:00:00)")
    parser.add_argument("--launcher", choices=("local", "slurm-task"), default="local", help=argparse.SUPPRESS)
    return parser


def add_run_options(parser: argparse.ArgumentParser, *, jobs: str = "runs at a time (default 1)") -> None:
    """The flags of every command that runs sweep runs into a folder (sweep, tune)."""
    parser.add_argument("--out", required=True, metavar="DIR", help="the sweep folder (runs/<run>/ inside)")
    parser.add_argument("--data", default=None, metavar="DIR", help="the prepared data (default: the file's data.dir)")
    parser.add_argument("--jobs", type=int, default=1, help=jobs)
    parser.add_argument("--threads-per-job", type=int, default=None,
                        help="CPU threads per run (OMP_NUM_THREADS; default: the environment's)")
    parser.add_argument("--done-from", action="append", default=[], metavar="DIR",
                        help="a folder (e.g. a committed report, docs/reproduction) whose runs/<run>/ copies of "
                             "finished runs are adopted instead of re-run (repeatable)")


def report_adopted(names: list[str], sources: list[Path]) -> None:
    if names:
        print(f"adopted {len(names)} finished runs from {', '.join(map(str, sources))}: {', '.join(names)}", flush=True)


def select(runs: list[Run], patterns: list[str] | None) -> list[Run]:
    import fnmatch

    if not patterns:
        return runs
    return [r for r in runs if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    check_positive(parser, args, ("jobs", "threads_per_job", "slurm_nodes", "slurm_gpus_per_node"))
    try:
        sweep = load_sweep(args.sweep, data_dir=args.data)
        runs = select(sweep.runs, args.only)
        if not runs:
            raise SweepError(f"--only {args.only} matches none of the {len(sweep.runs)} runs "
                             f"(e.g. {sweep.runs[0].name!r})")
        root = Path(args.out)
        check_inside(root, runs)
        sources = [Path(d) for d in args.done_from]
        elsewhere = finished_elsewhere(sweep, runs, sources) if sources else {}  # refuses a different recipe now
        if args.dry_run:
            return dry_run(sweep, root, runs, args.flops_per_second, elsewhere)
        for run in runs:  # bad overrides fail here, before anything is written or launched
            predict(run_recipe(sweep, run, root / "runs" / run.name))
        if args.slurm:
            check_slurm_options(root, args)
        root.mkdir(parents=True, exist_ok=True)
        if args.launcher == "local":
            write_text(root / "sweep.yaml", sweep.text)
        runner = Runner(sweep, root, threads=args.threads_per_job, launcher=args.launcher)
        prepare_data(sweep, runner)
        if args.slurm:
            return write_slurm(sweep, root, runs, args)
        if args.launcher == "local":
            record_invocation(root, list(sys.argv[1:] if argv is None else argv), args)
        report_adopted(adopt_finished(sweep, root, runs, sources) if sources else [], sources)
        return run_all(runner, runs, args.jobs)
    except (SweepError, ValueError) as err:
        print(f"error: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2


def check_inside(root: Path, runs: list[Run]) -> None:
    """Refuse a run whose folder would resolve outside ``--out`` (before anything is written)."""
    top = root.resolve()
    for run in runs:
        if not (root / "runs" / run.name).resolve().is_relative_to(top):
            raise SweepError(f"run {run.name!r} is invalid: its folder would lie outside --out {str(root)!r}")


def run_all(runner: Runner, runs: list[Run], jobs: int) -> int:
    states = {r.name: RunFolder(runner.root, r).state(runner.sweep.evals) for r in runs}
    todo = [r for r in runs if states[r.name] != "done"]
    # Started runs first (their work is half done), then breadth first over the seeds: a
    # sweep stopped half way has every configuration once before it has any twice.
    seed_rank = {seed: i for i, seed in enumerate(dict.fromkeys(sorted(r.seed for r in runs)))}
    todo.sort(key=lambda r: (states[r.name] not in ("partial", "trained"), seed_rank[r.seed]))
    print(f"{len(runs)} runs: {len(runs) - len(todo)} done, {len(todo)} to run, {jobs} at a time", flush=True)
    previous = {sig: signal.signal(sig, lambda *_: runner.stop()) for sig in (signal.SIGTERM, signal.SIGINT)}
    results = []
    printer = StatusPrinter(lambda: dict(runner.training))
    printer.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(runner.run, r): r for r in todo}
            for future in concurrent.futures.as_completed(futures):
                status = future.result()
                results.append(status)
                cpu = sum(s.get("cpu_seconds", 0.0) for s in status.get("stages", {}).values())
                detail = f": {status.get('error')}" if status["state"] != "done" else ""
                print(f"[{len(results)}/{len(todo)}] {status['run']}: {status['state']} "
                      f"({cpu:.0f} CPU s){detail}", flush=True)
    finally:
        printer.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    failed = [s for s in results if s["state"] != "done"]
    if runner.stopping:
        print("stopped: run the same command again to resume", file=sys.stderr)
        return 128 + signal.SIGTERM
    if failed:
        print(f"{len(failed)} of {len(todo)} runs did not finish: "
              + "; ".join(f"{s['run']} ({s.get('failed_stage')}): {s.get('error')}" for s in failed), file=sys.stderr)
        return 1
    print(f"all {len(runs)} runs done: layerdrop report {runner.root}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
