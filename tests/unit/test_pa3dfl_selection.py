"""benchmarks/pa3dfl_selection.py: each selection rule picks the alpha its definition says (a
hand-made grid), and on a tiny real-FMNIST Pa3dFL run its instrumented evaluation reproduces the
run's own all-client figures (alpha 0 is M0, Pa3dFL's pick is the grid's) while scoring every
alpha, and keeps each measurement in the committed record too (a machine laid anew passes over it);
bad input is refused before any work."""

from __future__ import annotations

import json
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCH / "pa3dfl_selection.py"
MOD = runpy.run_path(str(SCRIPT), run_name="pa3dfl_selection")


def _row(val: list[float], test: list[float], loss: list[float]) -> dict[str, float]:
    row: dict[str, float] = {}
    for k, (v, t, lo) in enumerate(zip(val, test, loss, strict=True)):
        row |= {f"alpha_val_acc_{k}": v, f"alpha_test_acc_{k}": t, f"alpha_val_loss_{k}": lo}
        row[f"alpha_test_loss_{k}"] = 0.0
    for i, m in enumerate(MOD["BODY_HEAD"]):  # 0.1, 0.2, 0.3, 0.4 on test; 0.5 ... on val
        row |= {f"cross_test_acc_{m}": 0.1 * (i + 1), f"cross_val_acc_{m}": 0.1 * (i + 5)}
    return row


def test_each_rule_picks_its_alpha() -> None:
    # validation ties at alphas 0.5 and 1.0; the lowest validation loss at 0.25; test best at 0
    row = _row(
        val=[0.5, 0.6, 0.7, 0.6, 0.7],
        test=[0.9, 0.8, 0.7, 0.6, 0.5],
        loss=[1.0, 0.4, 0.6, 0.5, 0.45],
    )
    c = MOD["choices"](row, 5)
    assert c["received"] == 0.9 and c["trained"] == 0.5
    assert c["selected"] == 0.5 and c["alpha_selected"] == 1.0  # ties: the largest alpha
    assert c["selected_ties_largest"] == 0.5
    # a run under alpha_ties: smallest picked alpha 0.5: its "selected" follows it
    assert MOD["choices"](row, 5, "smallest")["selected"] == 0.7
    assert c["selected_ties_smallest"] == 0.7  # ties: the smallest (alpha 0.5)
    assert c["selected_by_val_loss"] == 0.8 and c["val_selected_by_val_loss"] == 0.6
    assert c["oracle"] == 0.9 and c["every_alpha"] == pytest.approx(0.7)
    assert c["val_selected"] == 0.7 and c["val_received"] == 0.5

    other = _row(val=[0.8, 0.7, 0.6, 0.5, 0.4], test=[0.7] * 5, loss=[0.1] * 5)
    s = MOD["summarize"]([row, other], 5)
    assert s["clients"] == 2 and s["mean_alpha_selected"] == 0.5
    sel = s["selected"]
    assert sel["test"] == pytest.approx(60.0) and sel["test_gain"] == pytest.approx(-20.0)
    assert sel["val_gain"] == pytest.approx(10.0)  # +20 on the first client, 0 on the second
    assert sel["ahead_level_behind"] == [0, 1, 1]
    assert s["oracle"]["ahead_level_behind"] == [0, 2, 0]
    assert s["body_head"]["received_local"] == pytest.approx({"test": 20.0, "val": 60.0})
    assert s["body_head"]["trained_local"] == pytest.approx({"test": 40.0, "val": 80.0})


def test_the_figure_draws_each_runs_grid_means(tmp_path: Path) -> None:
    rows = [
        _row(val=[0.5, 0.7, 0.6], test=[0.9, 0.8, 0.7], loss=[1.0] * 3),
        _row(val=[0.7, 0.5, 0.4], test=[0.7, 0.6, 0.5], loss=[1.0] * 3),
    ]
    entry = {"run": "ideal-pa3dfl-r500-s0", "state": "best.pt", "state_round": 7,
             "n_alpha": 3, "per_client": rows, "summary": MOD["summarize"](rows, 3)}  # fmt: skip
    alphas, val, test = MOD["alpha_means"](entry)
    assert alphas == [0.0, 0.5, 1.0]
    assert val == pytest.approx([60.0, 60.0, 50.0]) and test == pytest.approx([80.0, 70.0, 60.0])
    assert MOD["plot_alpha"]({"runs": {}}, tmp_path) is None  # nothing measured
    written = MOD["plot_alpha"]({"runs": {"a": entry, "b": entry}}, tmp_path / "plots")
    assert written == str(tmp_path / "plots" / "selection.png")
    assert Path(written).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # a 2-round Pa3dFL run, its all-client evaluation, then the grid: ~40 s
def test_the_grid_reproduces_the_runs_own_figures(data_root: Path, tmp_path: Path) -> None:
    out, runs = tmp_path / "selection.json", tmp_path / "runs"
    record = tmp_path / "records" / "selection.json"
    small = [
        "--set", f"data_root={data_root}", "--set", "num_clients=6",
        "--set", "samples_per_client=60", "--set", "local_epochs=1",
        "--set", "algorithm_params.power_iterations=2", "--label", "tiny",
        # the other tie rule: the grid's "selected" must follow the run's own
        "--set", "algorithm_params.alpha_ties=smallest",
    ]  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(BENCH / "reproduce_pa3dfl_table1.py"), "--methods", "pa3dfl",
         "--settings", "ideal", "--seeds", "0", "--rounds", "2", "--workers", "1",
         "--out", str(runs), "--records", str(tmp_path / "records"), *small],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    every = json.loads((runs / "ideal-pa3dfl-tiny-r2-s0" / "all_clients.json").read_text())

    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "2", "--runs", str(runs), "--out", str(out),
         "--records", str(record), *small],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    entry = json.loads(out.read_text())["runs"]["ideal-pa3dfl-tiny-r2-s0@best.pt"]
    assert entry["state_round"] == every["state_round"] and entry["n_alpha"] == 11
    assert entry["alpha_ties"] == "smallest"
    rows = entry["per_client"]
    assert [r["client"] for r in rows] == list(range(6))
    for mine, theirs in zip(rows, every["per_client"], strict=True):
        # the same clients, streams and state: the run's own evaluation, to the bit
        for key in ("accuracy", "accuracy_before", "selected_alpha", "val_accuracy"):
            assert mine[key] == theirs[key], key
        assert all(f"alpha_test_acc_{k}" in mine for k in range(11))
        # the fixed global head is not trained: only the body differs between these two
        assert mine["cross_test_acc_received_global"] == theirs["accuracy_before"]
        assert 0 <= mine["cross_test_acc_trained_global"] <= 1
    s = entry["summary"]
    assert s["selected"]["test"] == pytest.approx(100 * every["accuracy"], abs=1e-3)
    assert s["received"]["test"] == pytest.approx(100 * every["accuracy_before"], abs=1e-3)
    assert s["oracle"]["test"] >= max(s[r]["test"] for r in MOD["RULES"]) - 1e-9
    assert "| ideal-pa3dfl-tiny-r2-s0 | best.pt (" in done.stdout
    assert set(s["body_head"]) == set(MOD["BODY_HEAD"])
    # the global head is fixed, so a round-2 state's received body with it scores as M0
    assert s["body_head"]["received_global"]["test"] == pytest.approx(s["received"]["test"])

    # the same state again is passed over (the queue reruns this step); other clients are not
    before = out.read_bytes()
    again = [sys.executable, str(SCRIPT), "--rounds", "2", "--runs", str(runs), "--out", str(out)]
    again += ["--records", str(record)]
    done = subprocess.run([*again, *small], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "best.pt already measured" in done.stderr, done.stderr[-3000:]
    assert out.read_bytes() == before
    done = subprocess.run(
        [*again, *small, "--clients", "2"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    redone = json.loads(out.read_text())["runs"]["ideal-pa3dfl-tiny-r2-s0@best.pt"]
    assert len(redone["per_client"]) == 2 and redone["state_sha256"] == entry["state_sha256"]

    # every measurement is also in the committed record, with its machine and code
    kept = json.loads(record.read_text())["runs"]["ideal-pa3dfl-tiny-r2-s0@best.pt"]
    assert {k: v for k, v in kept.items() if k not in ("machine", "code")} == redone
    assert kept["machine"]["cpus"] >= 1 and "commit" in kept["code"]
    # a machine laid anew (no output, no run folder): the record's entry is reported and
    # passed over, nothing is measured or written
    out.unlink()
    shutil.rmtree(runs)
    done = subprocess.run([*again, *small], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "its state is not here" in done.stderr, done.stderr[-3000:]
    assert not out.exists() and "| ideal-pa3dfl-tiny-r2-s0 | best.pt (" in done.stdout
    summary = subprocess.run([*again, "--summary"], capture_output=True, text=True, timeout=600)
    assert summary.returncode == 0 and "| ideal-pa3dfl-tiny-r2-s0 | best.pt (" in summary.stdout


def test_bad_input_is_refused_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "selection.json"
    for args, message in (
        (["--set", "algorithm_params.hn_lr=1.0"], "--set needs --label"),
        (["--clients", "0"], "--clients must be at least 1"),
        (["--runs", str(tmp_path / "none")], "no run state"),
        (["--ablation", "no-hn", "--label", "x"], "--ablation sets its own"),
        (["--plot", str(tmp_path / "plots")], "--plot draws the --summary's runs"),
    ):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), *args, "--out", str(out)],
            capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr[-500:])
    assert list(tmp_path.iterdir()) == []
