"""benchmarks/harness.py: the one harness of the benchmark scripts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness import REPO, environment, timed, write_results


def test_timed_hands_back_the_work_and_two_clocks():
    result, wall, cpu = timed(lambda: sum(range(1000)))
    assert result == 499500 and wall >= 0 and cpu >= 0
    done, _, child_cpu = timed(lambda: subprocess.run([sys.executable, "-c", "pass"]), cpu="children")
    assert done.returncode == 0 and child_cpu >= 0


def test_results_carry_the_environment_unless_the_script_gave_its_own(tmp_path):
    plain = json.loads(write_results(tmp_path / "a.json", {"figure": 1.5}).read_text())
    assert plain["figure"] == 1.5 and set(environment()) <= set(plain["environment"])
    own = json.loads(write_results(tmp_path / "b.json", {"environment": {"load_avg_1min": [1, 2]}}).read_text())
    assert own["environment"] == {"load_avg_1min": [1, 2]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]  # no partial file left


def test_every_benchmark_script_uses_the_harness():
    """One import path, one clock, one results writer: no script of its own sys.path or timer."""
    scripts = [p for p in sorted((REPO / "benchmarks").glob("*.py")) if p.name != "harness.py"
               and "__main__" in p.read_text()]
    assert scripts
    for script in scripts:
        text = script.read_text()
        assert "from harness import" in text, script.name
        assert "sys.path.insert" not in text and "sys.path[:0]" not in text, script.name
        assert "def timed(" not in text and "time.process_time()" not in text, script.name
        assert "resource.getrusage" not in text, script.name
    assert Path(REPO, "benchmarks", "harness.py").is_file()
