"""benchmarks/table1_summary.py: the figures BENCHMARKS.md's Table 1 rows are printed from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "table1_summary.py"


def _write_run(folder: Path, rows: list[dict]) -> None:
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "spent.json").write_text(json.dumps({"seconds": 12.5}))


def _row(rnd: int, acc: float | None, before: float | None, eps: float | str = "inf") -> dict:
    return {"round": rnd, "accuracy": acc, "accuracy_before": before, "epsilon": eps}


def _summary(out: Path, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--rounds", "10", "20", *extra],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_summary_means_over_seeds_and_keeps_a_replayed_rounds_last_row(tmp_path: Path) -> None:
    # seed 0 was resumed: round 20 was logged twice, and the second row is the one that counts
    _write_run(
        tmp_path / "fedavg-20-s0",
        [_row(10, 0.80, 0.70), _row(20, 0.10, 0.10), _row(20, 0.90, 0.84)],
    )
    _write_run(tmp_path / "fedavg-20-s1", [_row(10, 0.82, 0.72), _row(20, 0.88, 0.86)])
    _write_run(tmp_path / "fedavg-20-s2", [_row(10, 0.50, 0.40)])  # still running
    _write_run(
        tmp_path / "dp_fedavg-paper-protocol-20-s0",
        [_row(10, 0.30, None, 0.5), _row(15, None, None, 0.7)],
    )
    (tmp_path / "not-a-run").mkdir()

    out = json.loads(_summary(tmp_path))
    runs = {r["run"]: r for r in out["runs"]}
    assert set(runs) == {
        "fedavg-20-s0",
        "fedavg-20-s1",
        "fedavg-20-s2",
        "dp_fedavg-paper-protocol-20-s0",
    }
    assert runs["fedavg-20-s0"]["accuracy"] == {"10": 80.0, "20": 90.0}
    assert runs["fedavg-20-s0"]["accuracy_before"]["20"] == 84.0
    dp = runs["dp_fedavg-paper-protocol-20-s0"]
    assert (dp["method"], dp["label"], dp["rounds_done"], dp["epsilon"]) == (
        "dp_fedavg",
        "paper-protocol",
        15,
        0.7,
    )
    assert runs["fedavg-20-s0"]["paper"] == 85.67

    summary = {(s["method"], s["label"]): s for s in out["summary"]}
    fedavg = summary[("fedavg", "")]
    # the seed that has not reached round 20 is named, not averaged in (nor does it pull the
    # mean back to round 10)
    assert fedavg["seeds"] == [0, 1] and fedavg["unfinished_seeds"] == [2]
    assert fedavg["round"] == 20
    assert fedavg["accuracy"] == pytest.approx(89.0)
    assert fedavg["accuracy_std"] == pytest.approx(2**0.5)  # sample std of 90 and 88
    assert fedavg["accuracy_before"] == pytest.approx(85.0)
    # a run without accuracy_before (logged before the metric existed) has no before mean
    assert summary[("dp_fedavg", "paper-protocol")]["accuracy_before"] is None


def test_markdown_rows_read_after_slash_before(tmp_path: Path) -> None:
    _write_run(tmp_path / "local-20-s0", [_row(10, 0.8512, 0.8433), _row(20, 0.86, None)])
    lines = _summary(tmp_path, "--markdown").splitlines()
    assert lines[0] == "| run | paper | 10 | 20 |"
    assert lines[2] == "| local-20-s0 | 85.93 | 85.12 / 84.33 | 86.00 / - |"


def test_markdown_means_beside_the_paper_only_at_its_round(tmp_path: Path) -> None:
    _write_run(tmp_path / "hyperfl-20-s0", [_row(10, 0.80, 0.79), _row(200, 0.89, 0.88)])
    _write_run(tmp_path / "hyperfl-20-s1", [_row(10, 0.82, 0.81), _row(200, 0.87, 0.90)])
    _write_run(tmp_path / "fedavg-20-s0", [_row(10, 0.83, 0.72), _row(20, 0.86, 0.77)])
    _write_run(tmp_path / "fedavg-20-s1", [_row(10, 0.84, 0.73)])
    lines = _summary(tmp_path, "--markdown").splitlines()
    means = lines[
        lines.index(
            "| method | clients | seeds | round | paper | after | before | before - paper |"
        ) :
    ]
    assert means[2] == "| fedavg | 20 | 0 (1 running) | 20 | 85.67 | 86.00 | 77.00 | - |"
    # mean 89.00 and sample std 1.41 before training, 0.72 above the paper's 88.28 at round 200
    assert means[3] == "| hyperfl | 20 | 0, 1 | 200 | 88.28 | 88.00 ± 1.41 | 89.00 ± 1.41 | +0.72 |"


def test_plot_of_the_seed_means(tmp_path: Path) -> None:
    from PIL import Image

    _write_run(tmp_path / "runs" / "local-20-s0", [_row(10, 0.80, 0.79), _row(20, 0.85, 0.84)])
    _write_run(tmp_path / "runs" / "local-20-s1", [_row(10, 0.81, 0.80), _row(20, 0.86, 0.85)])
    png = tmp_path / "plots" / "table1.png"
    _summary(tmp_path / "runs", "--plot", str(png))
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size[0] > image.size[1]  # two panels side by side

    _write_run(tmp_path / "empty" / "local-20-s0", [_row(1, None, None)])
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "empty"), "--plot", str(png)],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "no evaluated rounds" in done.stderr


def test_clients_keeps_one_column(tmp_path: Path) -> None:
    _write_run(tmp_path / "local-20-s0", [_row(10, 0.80, 0.79)])
    _write_run(tmp_path / "local-100-s0", [_row(10, 0.70, 0.69)])
    both = {r["run"] for r in json.loads(_summary(tmp_path))["runs"]}
    assert both == {"local-20-s0", "local-100-s0"}
    only = json.loads(_summary(tmp_path, "--clients", "100"))
    assert [r["run"] for r in only["runs"]] == ["local-100-s0"]
    assert [(s["clients"], s["paper"]) for s in only["summary"]] == [(100, 87.01)]


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "nowhere: no such folder" in done.stderr
    assert "Traceback" not in done.stderr
