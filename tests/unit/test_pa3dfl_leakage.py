"""benchmarks/pa3dfl_leakage.py: on a small real-FMNIST Ideal run, FedAvg's and Pa3dFL's round-1
uploads of client 0 are attacked and recorded (in the output and in the committed record, with
the machine and code), a case already in either is not run again, and a variant without a label
is refused before any work."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "pa3dfl_leakage.py"


def _run(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args])
    runpy.run_path(str(SCRIPT), run_name="__main__")


@pytest.mark.slow  # a benchmark script's or tuning's end-to-end run: `make slow`
def test_each_method_is_attacked_and_a_done_case_is_kept(
    data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, record = tmp_path / "leakage.json", tmp_path / "records" / "leakage.json"
    small = ["--set", f"data_root={data_root}", "--set", "num_clients=10"]
    small += ["--set", "samples_per_client=60", "--set", "local_epochs=1", "--label", "small"]
    common = ["--images", "2", "--iterations", "3", "--out", str(out), "--records", str(record)]
    # two power-iteration steps behind Pa3dFL's balanced HN step, not 20 (its start's cost)
    cheap = ["--set", "algorithm_params.power_iterations=2"]
    _run(monkeypatch, ["--methods", "fedavg", *common, *small])
    _run(monkeypatch, ["--methods", "pa3dfl", *common, *small, *cheap])
    doc = json.loads(out.read_text())
    cases = doc["cases"]
    assert set(cases) == {"fedavg-small-ideal-r1-it3", "pa3dfl-small-ideal-r1-it3"}
    for method in ("fedavg", "pa3dfl"):
        case = cases[f"{method}-small-ideal-r1-it3"]
        assert case["method"] == method and case["attacked_round"] == 1
        assert case["client"] == 0 and case["client_width"] == 1.0  # Ideal: full width
        # both records attacked and scored against the no-upload guess; both carry their record
        assert case["leak_images"] == 2 and case["leak_psnr_baseline"] is not None
        assert case["leak_informative"] == 2
        assert "local_epochs=1" in case["overrides"]
    assert doc["machine"]["cpus"] >= 1
    kept = json.loads(record.read_text())["cases"]
    assert set(kept) == set(cases)
    for key, case in kept.items():  # the run's own output, with where and what it ran
        assert {k: v for k, v in case.items() if k not in ("machine", "code")} == cases[key]
        assert case["machine"]["cpus"] >= 1 and "commit" in case["code"]
    # a case in the file is not run again (a resumable chunk): its record stays as it was
    cases["pa3dfl-small-ideal-r1-it3"]["leak_psnr"] = "kept"
    out.write_text(json.dumps(doc))
    _run(monkeypatch, ["--methods", "pa3dfl", *common, *small, *cheap])
    assert json.loads(out.read_text())["cases"]["pa3dfl-small-ideal-r1-it3"]["leak_psnr"] == "kept"
    # nor is a case the record holds, where the output is gone (a machine laid anew)
    out.unlink()
    _run(monkeypatch, ["--methods", "pa3dfl", *common, *small, *cheap])
    assert not out.exists()  # nothing ran, nothing written
    assert json.loads(record.read_text())["cases"] == kept


def test_a_variant_needs_a_label(tmp_path: Path) -> None:
    out = tmp_path / "leakage.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--set", "algorithm_params.hn_aggregation=false",
         "--out", str(out)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and "--set needs --label" in done.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []
