"""The one harness every script in benchmarks/ uses: where the repository's packages are
found, how a piece of work is timed, and how results are written with the environment
they were measured in.

    from harness import REPO, RESULTS, clocks, environment, timed, write_results

A script runs as ``python benchmarks/NAME.py``, which puts only benchmarks/ on the
path: importing this module first puts the repository there too (an uninstalled
checkout, and ``benchmarks.plain_training``). Results are written atomically
(framework/files/atomic_write.py) as indented JSON, and every results file carries an
``environment`` block, so a figure says on what it was taken: speed figures on a shared
machine mean little without the load beside them.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

T = TypeVar("T")


CPU = ("self", "children", "all")


def clocks(cpu: str = "self") -> tuple[float, float]:
    """(wall, CPU) seconds now, for spans that start and end in different places (a
    callback's hooks). CPU: this process's (``self``), that of the child processes it
    waited for (``children``: a command run with subprocess), or both (``all``)."""
    if cpu == "self":
        return time.perf_counter(), time.process_time()
    if cpu not in CPU:
        raise ValueError(f"cpu={cpu!r} is invalid: allowed {', '.join(CPU)}")
    used = [resource.getrusage(who) for who in ((resource.RUSAGE_CHILDREN,) if cpu == "children"
                                                 else (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))]
    return time.perf_counter(), sum(u.ru_utime + u.ru_stime for u in used)


def timed(work: Callable[[], T], *, cpu: str = "self") -> tuple[T, float, float]:
    """(what ``work()`` returned, wall seconds, CPU seconds) of one call (``cpu`` as in ``clocks``)."""
    wall_before, cpu_before = clocks(cpu)
    result = work()
    wall_after, cpu_after = clocks(cpu)
    return result, wall_after - wall_before, cpu_after - cpu_before


def environment(**extra: Any) -> dict[str, Any]:
    """What a figure was measured on: versions, the machine, its CPUs and their load now,
    the OpenMP settings that change CPU timings."""
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "load_avg_1min": os.getloadavg()[0],
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, **extra}


def write_results(path: str | os.PathLike, result: dict[str, Any]) -> Path:
    """``result`` as indented JSON at ``path`` (atomically), with an ``environment`` block
    unless the script gave its own."""
    from framework.files.atomic_write import write_json

    return write_json(path, result if "environment" in result else {**result, "environment": environment()})


__all__ = ["REPO", "RESULTS", "CPU", "clocks", "timed", "environment", "write_results"]
