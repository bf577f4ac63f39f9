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


def _autogroup() -> str | None:
    path = Path("/proc/self/autogroup")
    return path.read_text().strip() if path.exists() else None


def test_a_queue_leading_its_session_renices_that_session(tmp_path: Path) -> None:
    # every step runs a stand-in python that logs the autogroup (the session's CPU share) it
    # runs in; the queue leads its own session under setsid, as the README starts it
    log = tmp_path / "autogroup.log"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\n(cat /proc/self/autogroup || echo none) >> {log} 2>/dev/null\n")
    fake.chmod(0o755)
    env = os.environ | {"PYTHON": str(fake), "WORKERS": "1", "AUTOGROUP_NICE": "7"}
    done = subprocess.run(
        ["setsid", "bash", str(QUEUE)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "queue done" in done.stdout
    seen = log.read_text().splitlines()
    steps = subprocess.run(["bash", str(QUEUE), "--list"], capture_output=True, text=True)
    assert len(seen) == 3 + len(steps.stdout.splitlines())  # the preflight's three, then each step
    if _autogroup() is None:  # a kernel without autogroups: nothing to renice, the queue runs
        assert set(seen) == {"none"}
    else:
        assert all(line.endswith(" nice 7") for line in seen), seen


def test_a_queue_in_the_callers_session_leaves_its_nice_alone(tmp_path: Path) -> None:
    before = _autogroup()
    env = os.environ | {"PYTHON": str(tmp_path / "no-venv" / "python"), "AUTOGROUP_NICE": "7"}
    done = subprocess.run(["bash", str(QUEUE)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2  # stopped at the preflight, after the renice would have run
    assert _autogroup() == before
