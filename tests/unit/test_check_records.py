"""benchmarks/check_records.py: a record made by today's code is reproduced round for round; one
whose loss was made otherwise is named with its first differing round (exit 1); a file that is
not a record is refused before any run (exit 2)."""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

from _runs import resume_run  # noqa: E402


def _main(args: list[str]) -> tuple[int, dict]:  # type: ignore[type-arg]
    mod = runpy.run_path(str(BENCH / "check_records.py"), run_name="check")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = mod["main"](args)
    return code, json.loads(buf.getvalue()) if buf.getvalue() else {}


def test_a_record_is_reproduced_and_a_changed_one_is_named(
    tiny_config: dict, tmp_path: Path
) -> None:
    from flcore.config import ExperimentConfig

    cfg = ExperimentConfig.model_validate(tiny_config | {"rounds": 3})
    record = tmp_path / "records" / "run.json"
    resume_run(cfg, tmp_path / "run", checkpoint_every=5, deadline=time.time() + 600, record=record)
    code, out = _main([str(record), "--rounds", "3"])
    (result,) = out["records"]
    assert code == 0 and result["rounds_compared"] == 3 and result["first_differing_round"] is None
    assert result["record_code"]["started"] is not None  # the record names the code it ran

    # the same record with round 2's loss off in its 4th digit: named, exit 1
    doc = json.loads(record.read_text())
    col = doc["curve"]["columns"].index("train_loss")
    doc["curve"]["rows"][1][col] *= 1.001
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(doc))
    code, out = _main([str(record), str(changed), "--rounds", "2"])
    assert code == 1
    assert [r["first_differing_round"] for r in out["records"]] == [None, 2]


def test_a_file_that_is_not_a_record_is_refused_before_any_run(tmp_path: Path) -> None:
    other = tmp_path / "summary.json"
    other.write_text(json.dumps({"accuracy": 0.5}))
    for args in ([str(other)], [str(tmp_path / "missing.json")], [str(other), "--rounds", "0"]):
        with pytest.raises(SystemExit) as exc, contextlib.redirect_stderr(io.StringIO()):
            _main(args)
        assert exc.value.code == 2
