"""`layerdrop sweep --slurm`: the sweep as a SLURM job array, one task per unfinished run.

Each array task runs `layerdrop sweep <out>/sweep.yaml --only <its run> --launcher
slurm-task`: the same resumable stages as a local sweep, except that training goes
through recipes/launch/slurm.sbatch (srun, one task per GPU on every node of the task's
allocation, ``--resume auto``), so a run can itself span nodes. Evaluations then run on
the task's first node.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

from eval.experiments.sweep.run_folder import RunFolder, layerdrop
from eval.experiments.sweep.spec import Run, Sweep, SweepError
from framework.files.atomic_write import write_text

SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d+){0,2}$")
UNSAFE_IN_DIRECTIVES = '\n\r"\'%\\'


def check_slurm_options(root: Path, args: argparse.Namespace) -> None:
    """Refuse, before anything is written, what array.sbatch cannot hold safely: its
    #SBATCH lines are read by sbatch, not by a shell, so no quoting protects them."""
    if not SLURM_TIME.match(args.slurm_time):
        raise SweepError(f"--slurm-time {args.slurm_time!r} is invalid: expected [days-]hours:minutes:seconds, "
                         "e.g. 24:00:00 or 2-00:00:00")
    log_folder = str((root / "slurm").resolve())
    unsafe = sorted(set(log_folder) & set(UNSAFE_IN_DIRECTIVES))
    if unsafe:
        raise SweepError(f"--out {str(root)!r} is invalid with --slurm: the job's log path would hold {unsafe} in an "
                         "#SBATCH line (a newline, a quote or Slurm's % patterns): choose a folder without them")


def write_slurm(sweep: Sweep, root: Path, runs: list[Run], args: argparse.Namespace) -> int:
    """A job array with one task per unfinished run; each task runs this command for its run."""
    check_slurm_options(root, args)
    pending = [r for r in runs if RunFolder(root, r).state(sweep.evals) != "done"]
    folder = root / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / "runs.txt", "".join(f"{r.name}\n" for r in pending))
    sweep_copy = (root / "sweep.yaml").resolve()
    command = [*layerdrop(), "sweep", str(sweep_copy), "--out", str(root.resolve()), "--data",
               str(sweep.data_dir.resolve()), "--only", "$RUN", "--launcher", "slurm-task"]
    if args.threads_per_job:
        command += ["--threads-per-job", str(args.threads_per_job)]
    script = folder / "array.sbatch"
    # Every value in the shell part is quoted: a space or a $(...) in a path stays a path.
    write_text(script, SLURM_TEMPLATE.format(
        nodes=args.slurm_nodes, gpus=args.slurm_gpus_per_node, time=args.slurm_time, out=folder.resolve(),
        repo=shlex.quote(str(Path.cwd().resolve())), runs=shlex.quote(str((folder / "runs.txt").resolve())),
        command=" ".join(shlex.quote(w) if w != "$RUN" else '"$RUN"' for w in command)))
    limit = f"%{args.jobs}" if args.jobs else ""
    print(f"wrote {script} ({len(pending)} array tasks, {len(runs) - len(pending)} runs already done)")
    if pending:
        print(f"submit: sbatch --array=0-{len(pending) - 1}{limit} {script}")
    return 0


SLURM_TEMPLATE = """#!/usr/bin/env bash
# One task of a `layerdrop sweep` job array: array index i runs line i+1 of runs.txt.
# Training goes through recipes/launch/slurm.sbatch (srun, one task per GPU on every node
# of this task's allocation), then the run's evaluations run on the first node. A task
# that is requeued or resubmitted resumes its run (`--resume auto`; finished stages are
# skipped). Written by `layerdrop sweep --slurm`; submit with the sbatch line it printed.
#SBATCH --job-name=layerdrop-sweep
#SBATCH --nodes={nodes}
#SBATCH --gpus-per-node={gpus}
#SBATCH --ntasks-per-node={gpus}
#SBATCH --time={time}
#SBATCH --output="{out}/%A_%a.out"
set -euo pipefail
cd {repo}
RUNS={runs}
RUN=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" "$RUNS")
if [[ -z "$RUN" ]]; then
    echo "no run at array index $SLURM_ARRAY_TASK_ID in $RUNS" >&2
    exit 2
fi
exec {command}
"""


__all__ = ["write_slurm", "check_slurm_options", "SLURM_TEMPLATE"]
