"""Several processes opening one new sqlite MLflow store at once (two ``fedsweep run``s started
together in a fresh folder): each gets its run, none fails on the schema's creation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sweeps.tracking import mlflow_client

REPO = Path(__file__).resolve().parents[2]

_WRITER = """
import sys
sys.path.insert(0, {repo!r})
from flcore.callbacks import RoundResult
from sweeps.tracking import MLflowCallback
cb = MLflowCallback(experiment="race", params={{"writer": sys.argv[2]}}, uri=sys.argv[1])
cb.on_round_end(RoundResult(1, (0,), {{"accuracy": 0.5}}, True))
cb.finish()
"""


def test_concurrent_writers_on_a_new_store(tmp_path: Path) -> None:
    script = tmp_path / "writer.py"
    script.write_text(_WRITER.format(repo=str(REPO)))
    writers = 4
    # one fresh store: without the lock 3 of 4 writers failed on most fresh stores
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), uri, str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(writers)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * writers, "\n".join(errors)[-3000:]
    client = mlflow_client(uri, initialize=False)
    exp = client.get_experiment_by_name("race")
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.data.params["writer"] for r in runs) == [str(i) for i in range(writers)]
    assert all(r.data.metrics["accuracy"] == 0.5 for r in runs)
