"""flcore.data.conv_layout (channels-last images on the CPU) and benchmarks/cpu_layout.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flcore.data import conv_layout

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_layout.py"


def test_conv_layout_changes_the_layout_on_the_cpu_only_and_never_the_values() -> None:
    x = torch.randn(6, 1, 28, 28)
    y = conv_layout(x, torch.device("cpu"))
    assert torch.equal(x, y) and y.stride() == (784, 1, 28, 1)  # channels-last strides
    assert y[torch.tensor([4, 0])].stride() == (784, 1, 28, 1)  # an indexed batch keeps it
    assert conv_layout(x, torch.device("cuda")) is x  # elsewhere: untouched (no GPU needed)
    flat = torch.randn(6, 10)
    assert conv_layout(flat, torch.device("cpu")) is flat
    conv = torch.nn.Conv2d(1, 4, 5, padding=2)
    assert torch.allclose(conv(y), conv(x), atol=1e-5)


@pytest.mark.slow  # a benchmark script's or tuning's end-to-end run: `make slow`
def test_the_benchmark_times_both_layouts_interleaved(data_root: Path) -> None:
    small = ["num_clients=10", "samples_per_client=60", "local_epochs=1", f"data_root={data_root}"]
    args = [sys.executable, str(SCRIPT), "--reps", "1", "--cases", "fmnist_ideal_fedavg", "maml"]
    for item in small:
        args += ["--set", item]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    for case in ("fmnist_ideal_fedavg", "maml"):
        got = doc["cases"][case]
        assert len(got["seconds"]["default"]) == 2 and len(got["seconds"]["channels_last"]) == 1
        assert got["speedup"] > 0
    bad = subprocess.run(
        [sys.executable, str(SCRIPT), "--reps", "0"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "at least 1" in bad.stderr
