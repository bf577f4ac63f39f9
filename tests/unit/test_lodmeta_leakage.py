"""benchmarks/lodmeta_leakage.py: on a tiny real-FMNIST few-shot run, each method's case is
attacked and recorded (the walk's client and its visits; a server's drawn clients), a case
already in the output is not run again, and the script needs flcore alone."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "lodmeta_leakage.py"


def _run(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args])
    runpy.run_path(str(SCRIPT), run_name="__main__")


@pytest.mark.slow  # a benchmark script's or tuning's end-to-end run: `make slow`
def test_each_method_is_attacked_and_a_done_case_is_kept(
    data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "leakage.json"
    tiny = ["--set", f"data_root={data_root}", "--set", "model_params.hidden=4"]
    tiny += ["--set", "fewshot.unseen_clients=1"]
    common = ["--at", "first", "--clients", "4", "--images", "1", "--iterations", "2"]
    methods = ["lodmeta_sgd", "fedmaml", "fedalt"]
    _run(monkeypatch, ["--methods", *methods, *common, *tiny, "--out", str(out)])
    cases = json.loads(out.read_text())["cases"]
    assert set(cases) == {"lodmeta_sgd-first", "fedmaml-first", "fedalt-first"}
    walk, server = cases["lodmeta_sgd-first"], cases["fedmaml-first"]
    # the walk's step-1 client, on its first visit; the server attacks every client it drew
    assert walk["client"] in range(4) and walk["client_visits_before"] == 0
    assert walk["leak_images"] == 1 and walk["leak_psnr_baseline"] is not None
    assert server["client"] is None and server["client_visits_before"] is None
    assert server["leak_images"] == 4  # clients_per_round 4 of 4, one image each
    assert cases["fedalt-first"]["leak_images"] == 4
    # a case in the file is not run again (a resumable chunk): its record stays as it was
    cases["fedmaml-first"]["leak_psnr"] = "kept"
    out.write_text(json.dumps({"cases": cases}))
    _run(monkeypatch, ["--methods", "fedmaml", *common, *tiny, "--out", str(out)])
    assert json.loads(out.read_text())["cases"]["fedmaml-first"]["leak_psnr"] == "kept"
