"""benchmarks/reproduce_pa3dfl_table1.py on a tiny real-FMNIST override: it runs, stops at
--until-round, resumes to the end, skips an ended run, leaves its record, summarises (from the
folder or the record alone), and needs no Ray, MLflow or Optuna."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "reproduce_pa3dfl_table1.py"

# Runs the script's main() three times in one fresh interpreter (one torch import), then says
# which of the heavy sweep libraries that process imported.
_DRIVER = """
import contextlib, io, json, runpy, sys
sys.argv = [sys.argv[0]]
mod = runpy.run_path({script!r}, run_name="reproduce")
docs = []
for extra in ({first!r}, [], []):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        mod["main"]([*{common!r}, *extra])
    docs.append(json.loads(buf.getvalue()))
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & {{"ray", "mlflow", "optuna"}})
print(json.dumps({{"docs": docs, "heavy": heavy}}))
"""


@pytest.mark.slow  # three runs in a fresh interpreter plus --summary: ~24 s on a loaded machine
def test_a_tiny_run_stops_resumes_ends_and_summarises(data_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    common = [
        "--methods",
        "local",
        "--settings",
        "hetero",
        "--seeds",
        "0",
        "--rounds",
        "2",
        "--workers",
        "1",
        "--out",
        str(out),
        "--records",
        str(tmp_path / "records"),
        "--label",
        "tiny",
        "--set",
        f"data_root={data_root}",
        "--set",
        "num_clients=4",
        "--set",
        "samples_per_client=50",
        "--set",
        "local_epochs=1",
    ]
    driver = _DRIVER.format(script=str(SCRIPT), common=common, first=["--until-round", "1"])
    done = subprocess.run(
        [sys.executable, "-c", driver], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["heavy"] == []  # flcore alone: no Ray, MLflow or Optuna imported

    first, second, third = (d["runs"][0] for d in result["docs"])
    assert first["run"] == "hetero-local-tiny-r2-s0"  # its round count in its name
    assert (first["rounds"], first["rounds_done"], first["ended"]) == (2, 1, False)
    assert (second["rounds_done"], second["ended"]) == (2, True)
    assert second["comparable"] is False and second["paper"] == 74.98  # shown, not compared
    assert 0 <= second["accuracy"] <= 100 and second["accuracy_worst_width"] <= 100
    assert second["best_round"] in (1, 2) and second["ours_metric"] == "accuracy"
    assert third == second  # an ended run is only read back (its seconds too)

    run_dir = out / "hetero-local-tiny-r2-s0"
    rounds = [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").open()]
    assert rounds == [1, 2]  # round 1 ran once; the resumed run went on with round 2
    assert json.loads((run_dir / "summary.json").read_text())["rounds_completed"] == 2

    record = json.loads((tmp_path / "records" / "hetero-local-tiny-r2-s0.json").read_text())
    assert record["summary"] == json.loads((run_dir / "summary.json").read_text())
    assert record["config"]["capacity"]["name"] == "uniform" and record["config"]["rounds"] == 2
    assert [row[0] for row in record["curve"]["rows"]] == [1, 2]

    def summary(out_dir: Path) -> str:
        return subprocess.run(
            [sys.executable, str(SCRIPT), "--summary", "--out", str(out_dir),
             "--records", str(tmp_path / "records")],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    table = summary(out)
    row = next(line for line in table.splitlines() if line.startswith("| local (tiny)"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["hetero", "2 (ran 2)", "1"]
    assert cells[4] == f"{second['accuracy']:.2f} (accuracy)"
    assert cells[5] == "74.98" and cells[6] == "n/a (not the paper's setting)"
    # with the run folder gone (a new machine), its record gives the same table
    assert summary(tmp_path / "elsewhere") == table


def test_the_summary_compares_only_ended_runs_of_the_papers_setting() -> None:
    import runpy

    table = runpy.run_path(str(SCRIPT), run_name="reproduce")["summary_table"]

    def run(rounds_done: int, label: str = "", early: float = 0.0) -> dict:
        summary = {"rounds": rounds_done, "early_stopped": early, "accuracy": 0.9}
        return {"setting": "hetero", "method": "pa3dfl", "label": label, "rounds": 500,
                "seed": 0, "summary": summary}  # fmt: skip

    assert "n/a (run not ended)" in table([run(114)])
    diverged = run(6)
    diverged["summary"]["diverged_round"] = 6  # a NaN loss ended it (benchmarks/_runs.py)
    assert "n/a (diverged: NaN loss at round 6" in table([diverged])
    assert "+0.45" in table([run(500)])  # 90.00 against the paper's 89.55
    assert "+0.45" in table([run(230, early=1.0)])  # ended by early stopping
    assert "not the paper's setting" in table([run(500, label="clip10")])
    # Table 3's ablations are compared with Table 3's figures (Hetero only)
    ablated = table([run(500, label="flanc-dec")])
    assert "| pa3dfl (flanc-dec) |" in ablated and "84.58" in ablated and "+5.42" in ablated
    assert "78.94" in table([run(500, label="no-hn")])
    ideal = dict(run(500, label="no-hn"), setting="ideal")
    assert "| - | -" in table([ideal])  # no Ideal figure in Table 3's FMNIST column


def test_ablation_sets_its_override_and_refuses_other_methods(tmp_path: Path) -> None:
    import runpy

    mod = runpy.run_path(str(SCRIPT), run_name="reproduce")
    assert mod["is_comparable"](500, "flanc-dec", ["algorithm_params.decomposition=flanc"])
    assert not mod["is_comparable"](200, "flanc-dec", ["algorithm_params.decomposition=flanc"])
    assert not mod["is_comparable"](500, "flanc-dec", ["algorithm_params.decomposition=channel"])
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--ablation", "no-hn", "--methods", "fedavg",
         "--out", str(tmp_path / "o")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and "--ablation runs Pa3dFL alone" in done.stderr
    assert not (tmp_path / "o").exists()
