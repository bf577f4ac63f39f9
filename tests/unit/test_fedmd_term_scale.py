"""benchmarks/fedmd_term_scale.py on a tiny real-FMNIST override: the digest term is measured
from the consensus the clients trained towards, and bad input stops before any work."""

from __future__ import annotations

import contextlib
import io
import json
import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fedmd_term_scale.py"


def test_two_rounds_measure_the_term_where_local_training_ended(data_root: Path) -> None:
    main = runpy.run_path(str(SCRIPT), run_name="bench")["main"]
    over = [f"data_root={data_root}", "samples_per_client=60", "local_epochs=1",
            "public_samples=45", "global_test_per_class=20"]  # fmt: skip
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["--rounds", "2", "--workers", "1", *[a for o in over for a in ("--set", o)]])
    doc = json.loads(buf.getvalue())
    first, second = doc["rounds"]
    assert (first["round"], second["round"]) == (1, 2)
    assert doc["lambda_md"] == 0.05
    # round 1's clients digested nothing; round 2's trained towards round 1's consensus
    assert first["digest_term_end"] is None and second["digest_term_end"] > 0
    for row in (first, second):
        assert row["cross_entropy"] > 0 and row["digest_term"] > 0
        assert row["ratio"] == pytest.approx(row["digest_term"] / row["cross_entropy"])
        assert 0 <= row["accuracy"] <= 1


def test_no_rounds_is_refused_before_any_work() -> None:
    main = runpy.run_path(str(SCRIPT), run_name="bench")["main"]
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stderr(io.StringIO()):
        main(["--rounds", "0"])
    assert exc.value.code == 2
