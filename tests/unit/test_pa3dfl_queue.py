"""benchmarks/pa3dfl_queue.sh: where the scripts cannot start (a machine laid anew, no venv) it
stops with exit 2 and one line before any step, instead of failing every step in turn; ``--list``
prints both lanes' steps."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

QUEUE = Path(__file__).resolve().parents[2] / "benchmarks" / "pa3dfl_queue.sh"


def test_a_queue_without_its_python_stops_before_any_step(tmp_path: Path) -> None:
    env = os.environ | {"PYTHON": str(tmp_path / "no-venv" / "python")}
    done = subprocess.run(["bash", str(QUEUE)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""  # no step was logged, none started
    assert "cannot start benchmarks/reproduce_pa3dfl_table1.py" in done.stderr
    assert "make install-dev data" in done.stderr


def test_list_prints_both_lanes_with_the_worker_count() -> None:
    env = os.environ | {"WORKERS": "3"}
    done = subprocess.run(
        ["bash", str(QUEUE), "--list"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    train = [line for line in lines if line.startswith("train:")]
    attack = [line for line in lines if line.startswith("attack:")]
    assert train and attack and len(train) + len(attack) == len(lines)
    assert all("{W}" not in line for line in train)
    assert any("--workers 3" in line for line in train)
