"""benchmarks/pa3dfl_frozen_head.py and Pa3dFL's fixed global head: the head a width-p client
trains against, the reachability program on hand-made heads, one tiny real-FMNIST run, and bad
input refused before any work."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from flcore.algorithms.widths.pa3dfl import fixed_global_head
from flcore.models.scalable import ScalableCNNFashionMNIST

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "pa3dfl_frozen_head.py"


def _plain(width: float) -> ScalableCNNFashionMNIST:
    return ScalableCNNFashionMNIST(width=width)


def test_the_fixed_head_reads_the_full_heads_first_features_and_is_frozen() -> None:
    full = fixed_global_head(_plain, 3, 1.0)
    narrow = fixed_global_head(_plain, 3, 1 / 16)
    assert (full.in_features, narrow.in_features) == (128, 8)
    assert torch.equal(narrow.weight, full.weight[:, :8]) and torch.equal(narrow.bias, full.bias)
    assert not any(p.requires_grad for p in (*full.parameters(), *narrow.parameters()))
    assert torch.equal(fixed_global_head(_plain, 3, 1.0).weight, full.weight)  # seeded
    assert not torch.equal(fixed_global_head(_plain, 4, 1.0).weight, full.weight)


def _tiny_run(tmp_path: Path, *extra: str) -> tuple[list[str], Any, dict]:
    """The script on 300 records for one epoch, one thread, into ``tmp_path``: its arguments,
    the finished process (exit 0 asserted) and its JSON."""
    args = [sys.executable, str(SCRIPT), *extra, "--train-records", "300", "--epochs", "1"]
    args += ["--threads", "1", "--out-dir", str(tmp_path)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return args, done, json.loads(done.stdout)


@pytest.fixture(scope="module")
def script() -> dict:
    return runpy.run_path(str(SCRIPT))


def test_reachability_on_hand_made_heads(script: dict) -> None:
    reach = script["reachable_classes"]
    w = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    # class 2's logit is never above both others on non-negative features (ties at 0 only)
    assert reach(w, np.zeros(3)) == [True, True, False]
    # a bias lifts it: at x = 0 it wins
    assert reach(w, np.array([0.0, 0.0, 0.5])) == [True, True, True]
    # between the two others: 0.4 (x1 + x2) < max(x1, x2) always, 0.6 (x1 + x2) wins at x1 = x2
    assert reach(np.array([[1.0, 0.0], [0.0, 1.0], [0.4, 0.4]]), np.zeros(3))[2] is False
    assert reach(np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.6]]), np.zeros(3))[2] is True


@pytest.mark.slow  # a benchmark script's or tuning's end-to-end run: `make slow`
def test_a_tiny_run_reports_every_head_and_is_not_run_again(
    data_root: Path, tmp_path: Path
) -> None:
    args, done, doc = _tiny_run(tmp_path, "--seeds", "0", "--widths", "0.0625")
    saved = tmp_path / "frozen-head-n300-e1-lr0.05.json"
    assert doc["file"] == str(saved) and json.loads(saved.read_text())["rows"] == doc["rows"]
    again = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "not run again" in again.stderr
    assert json.loads(again.stdout)["rows"] == doc["rows"]
    (row,) = doc["rows"]
    assert (row["seed"], row["width"], row["features"]) == (0, 0.0625, 8)
    assert 1 <= row["reachable_classes"] <= 10
    assert len(row["unreachable"]) == 10 - row["reachable_classes"]
    for name in ("frozen", "frozen_probe", "trained"):
        for split in ("train", "test"):
            m = row[name][split]
            assert 0 <= m["min_class_recall"] <= m["accuracy"] <= 100 and m["cross_entropy"] > 0
    assert row["frozen"]["mean_feature_norm"] > 0
    # the probe is fitted on the training records' features: it fits them at least as well as
    # chance, and a frozen head's lowest recall is 0 on a class it cannot reach
    assert row["frozen_probe"]["train"]["accuracy"] > 10
    if row["unreachable"]:
        assert row["frozen"]["test"]["min_class_recall"] == 0
    assert "seed 0 width 0.0625: reachable" in done.stderr
    assert row["machine"]["cpus"] >= 1


def test_a_file_from_other_settings_is_refused(tmp_path: Path) -> None:
    saved = tmp_path / "frozen-head-n300-e1-lr0.05.json"
    saved.write_text(json.dumps({"settings": {"train_records": 300, "epochs": 2}, "rows": []}))
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--train-records", "300", "--epochs", "1"]
        + ["--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and "written under other settings" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--widths", "0.1"], "not a multiple of 1/16"),
        (["--train-records", "0"], "--train-records must be between"),
        (["--epochs", "0"], "--epochs must be at least 1"),
        (["--lr", "0"], "--lr must be positive"),
        (["--width-draw", "upto"], "--width-draw applies to --nested runs only"),
    ],
)
def test_bad_input_is_refused_before_any_work(args: list[str], message: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
    assert done.returncode == 2 and message in done.stderr and done.stdout == ""


def test_nested_draws_the_seeds_hetero_widths(script: dict) -> None:
    widths = script["client_widths"](2)
    assert len(widths) == 100 and widths.count(1 / 16) == 1  # seed 2's one width-1/16 client
    assert min(script["client_widths"](0)) == 1 / 8


def test_each_steps_width_is_a_clients_or_one_up_to_it(script: dict) -> None:
    pool = script["client_widths"](0)  # no width-1/16 client at seed 0
    stream = torch.Generator().manual_seed(0)
    own = [script["step_width"](pool, "own", stream) for _ in range(4000)]
    assert set(own) == set(pool) and 1 / 16 not in own
    # each client as often as the others: the share of the widest clients' width
    assert abs(own.count(max(pool)) / 4000 - pool.count(max(pool)) / 100) < 0.03
    upto = [script["step_width"]([0.25], "upto", stream) for _ in range(4000)]
    assert set(upto) == {1 / 16, 2 / 16, 3 / 16, 4 / 16}  # uniform up to the client's width
    assert all(abs(upto.count(w) / 4000 - 0.25) < 0.03 for w in set(upto))
    assert 1 / 16 in [script["step_width"](pool, "upto", stream) for _ in range(400)]


@pytest.mark.slow  # a benchmark script's or tuning's end-to-end run: `make slow`
def test_a_tiny_nested_run_keeps_the_frozen_head_and_evaluates_every_width(
    data_root: Path, tmp_path: Path
) -> None:
    args, done, doc = _tiny_run(tmp_path, "--nested", "--seeds", "2", "--widths", "0.125", "0.0625")
    saved = tmp_path / "frozen-head-nested-n300-e1-lr0.05.json"
    assert doc["file"] == str(saved) and doc["widths"] == [0.0625, 0.125]
    (row,) = doc["rows"]
    assert row["mode"] == "nested" and sum(row["client_widths"].values()) == 100
    assert row["client_widths"]["0.0625"] == 1
    assert row["frozen"]["head_change"] == 0 and row["trained"]["head_change"] > 0
    for name in ("frozen", "frozen_probe", "trained"):
        assert {"0.0625", "0.125"} <= set(row[name])
        for w in ("0.0625", "0.125"):
            m = row[name][w]["test"]
            assert 0 <= m["min_class_recall"] <= m["accuracy"] <= 100 and m["cross_entropy"] > 0
    assert "seed 2 nested, frozen / trained: 0.0625" in done.stderr
    again = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "not run again" in again.stderr
    assert json.loads(again.stdout)["rows"] == doc["rows"]
    # other widths are other settings: refused, not mixed in
    other = [a if a != "0.0625" else "0.25" for a in args]
    refused = subprocess.run(other, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "written under other settings" in refused.stderr
