"""benchmarks/heterofl_scaler.py: one round of the Hetero HeteroFL config on a small real-FMNIST
override, each trained client's width, loss and largest weight recorded, and bad input refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "heterofl_scaler.py"


@pytest.mark.slow  # a benchmark script's or tuning's end-to-end run: `make slow`
def test_one_round_records_every_trained_client(data_root: Path) -> None:
    small = ["num_clients=10", "samples_per_client=50", "local_epochs=1", f"data_root={data_root}"]
    args = [sys.executable, str(SCRIPT), "--rounds", "1", "--scaler", "off"]
    for item in small:
        args += ["--set", item]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["scaler"] == "off" and [r["round"] for r in doc["rounds"]] == [1]
    clients = doc["rounds"][0]["clients"]
    assert len(clients) == 2  # fraction 0.2 of 10 clients
    for c in clients:
        assert 0 < c["width"] <= 1 and c["loss"] > 0 and c["max_abs_weight"] > 0


def test_rounds_below_one_are_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "0"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--rounds must be at least 1" in done.stderr
