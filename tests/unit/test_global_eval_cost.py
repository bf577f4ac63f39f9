"""benchmarks/global_eval_cost.py on a tiny real-FMNIST override of its Hetero FjORD config: the
paired runs train the same clients to the same figures, one measures the global model each
round and the other on none, and bad input stops before any work."""

from __future__ import annotations

import contextlib
import io
import json
import runpy
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "global_eval_cost.py"


def test_paired_rounds_differ_only_by_the_global_evaluation(data_root: Path) -> None:
    main = runpy.run_path(str(SCRIPT), run_name="bench")["main"]
    over = [f"data_root={data_root}", "num_clients=5", "samples_per_client=50",
            "local_epochs=1", "global_test_per_class=20"]  # fmt: skip
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        main(["--rounds", "2", "--workers", "1", "--repeats", "1",
              *[a for o in over for a in ("--set", o)]])  # fmt: skip
    doc = json.loads(buf.getvalue())
    assert doc["algorithm"] == "fjord" and doc["global_test_records"] == 200
    assert doc["client_figures_differing"] == []  # the same clients trained the same way
    assert len(doc["round_seconds_with"]) == len(doc["round_seconds_without"]) == 2
    assert len(doc["evaluate_server_seconds"]) == 1 and doc["evaluate_server_seconds"][0] > 0
    assert doc["config"] == "sweeps/configs/pa3dfl/fmnist_hetero_fjord.yaml"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rounds", "0"], "at least 1"),
        (["--config", "nowhere.yaml"], "no such file"),
        (["--rounds", "500"], "below the config's 500"),
    ],  # fmt: skip
)
def test_bad_input_is_refused_before_any_work(argv: list[str], message: str) -> None:
    main = runpy.run_path(str(SCRIPT), run_name="bench")["main"]
    err = io.StringIO()
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stderr(err):
        main(argv)
    assert exc.value.code == 2 and message in err.getvalue()
