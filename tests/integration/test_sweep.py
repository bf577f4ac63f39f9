"""Sweeps on the embedded Ray: real trials on real FMNIST, a real MLflow store and Optuna RDB."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from sweeps.export import _unsanitize
from tests.integration.sweep_helpers import (
    child_runs,
    cli,
    client,
    env,
    study_states,
    tiny_spec,
    write_spec,
)


def test_two_trial_sweep_parent_children_parquet_and_study(data_root: Path, tmp_path: Path) -> None:
    # sampler seed 0 draws local, then fedavg (seed 1, the helper's, draws local twice)
    spec = tiny_spec(data_root, sampler={"name": "random", "seed": 0})
    # every trial also runs a (tiny) privacy evaluation of its last round
    spec["base"]["attack"] = {"name": "ig", "images": 1, "iterations": 5}
    path = write_spec(tmp_path, spec)
    out = cli(["sweep", str(path), "--json"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert {"experiment", "parent_run_id", "trials", "pareto"} <= set(doc)
    assert doc["experiment"] == "sweep-tests" and len(doc["trials"]) == 2
    for t in doc["trials"]:
        assert t["status"] == "FINISHED" and 0 <= t["accuracy"] <= 1
        assert isinstance(t["config"], dict) and t["config"]["algorithm"] == t["algorithm"]
    assert 1 <= len(doc["pareto"]) <= 2

    c = client(tmp_path)
    parent = c.get_run(doc["parent_run_id"])
    assert parent.info.status == "FINISHED"
    runs = child_runs(tmp_path)
    assert len(runs) == 2
    for run in runs:
        tags = run.data.tags
        assert tags["mlflow.parentRunId"] == doc["parent_run_id"]
        assert run.info.status == "FINISHED" and tags["status"] == "FINISHED"
        for tag in (
            "algorithm",
            "dataset",
            "fedsweep.sweep",
            "fedsweep.trial_id",
            "node_ip",
            "device",
        ):
            assert tags[tag], tag
        params = run.data.params
        assert params["algorithm"] == tags["algorithm"]
        assert "optimizer.momentum" in params and "lr" in params
        steps = sorted(m.step for m in c.get_metric_history(run.info.run_id, "accuracy"))
        assert steps == [1, 2]
        # MLflow's sqlite store keeps inf as the largest float; the export maps it back
        assert _unsanitize(run.data.metrics["epsilon"]) == (
            0.0 if tags["algorithm"] == "local" else float("inf")
        )
        assert tags["dp_guarantee"] == ("no-release" if tags["algorithm"] == "local" else "none")
        attacked = [f.path for f in c.list_artifacts(run.info.run_id, "attack")]
        if tags["algorithm"] == "local":  # nothing uploaded: nothing attacked
            assert "leak_psnr" not in run.data.metrics and attacked == []
        else:  # the trial's grid travelled from its worker to the driver
            assert run.data.metrics["leak_psnr"] > 0 and run.data.metrics["leak_images"] == 1
            assert attacked == ["attack/reconstructions.png"]
    assert {run.data.tags["algorithm"] for run in runs} == {"fedavg", "local"}
    df = pd.read_parquet(doc["results_parquet"])
    assert len(df) == 2 and set(df["status"]) == {"FINISHED"}
    assert {"accuracy", "bytes_up", "params.lr", "duration_s", "run_id"} <= set(df.columns)
    assert Path(doc["pareto_png"]).stat().st_size > 1000
    assert study_states(tmp_path) == ["COMPLETE", "COMPLETE"]

    # the report of a real sweep holds the spec its parent run logged
    report = cli(["report", "--experiment", "sweep-tests", "--out", "report.html"], tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    html = (tmp_path / "report.html").read_text()
    assert "Sweep <code>t</code>" in html and "sweep_spec.json" in html
    assert doc["parent_run_id"][:8] in html and "not started by a sweep" not in html
    assert all(t["run_id"][:8] in html for t in doc["trials"])


def test_failed_and_diverged_trials_are_recorded_while_others_finish(
    data_root: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(
        data_root,
        algorithms=["fedavg", "fedavg_raises", "fedavg_diverges"],
        objectives={"accuracy": "max"},
        num_samples=5,
        max_failures=1,
        sampler={"name": "random", "seed": 7},
    )  # draws all three
    out = cli(
        ["sweep", str(write_spec(tmp_path, spec)), "--json"],
        tmp_path,
        FEDSWEEP_PLUGINS="tests.plugins.faults",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    by_alg: dict[str, list] = {}
    for run in child_runs(tmp_path):
        by_alg.setdefault(run.data.tags["algorithm"], []).append(run)
    assert set(by_alg) == {"fedavg", "fedavg_raises", "fedavg_diverges"}, by_alg.keys()
    for run in by_alg["fedavg"]:
        assert run.info.status == "FINISHED"
    for run in by_alg["fedavg_raises"]:
        assert run.info.status == "FAILED"
        assert run.data.tags["failure_reason"] == "error"
        assert "injected failure" in run.data.tags["error"]
        assert run.data.tags["retries"] == "1"  # retried max_failures times, then FAILED
    for run in by_alg["fedavg_diverges"]:
        assert run.info.status == "FAILED"
        assert run.data.tags["failure_reason"] == "diverged"
        assert "retries" not in run.data.tags  # divergence is not retried
    assert len(child_runs(tmp_path)) == 5


def test_dry_run_starts_no_ray(data_root: Path, tmp_path: Path) -> None:
    path = write_spec(tmp_path, tiny_spec(data_root))
    code = (
        "import sys\n"
        "from sweeps.cli import app\n"
        f"try:\n    app(['sweep', {str(path)!r}, '--dry-run', '--json'])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'ray' not in sys.modules, 'dry run imported ray'\n"
    )
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env(),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    plan = json.loads(out.stdout)
    assert plan["trials"] == 2 and plan["algorithms"] == ["fedavg", "local"]
    assert plan["objectives"][0]["name"] == "accuracy"
    assert not (tmp_path / "sweeps_out").exists() and not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"algorithms": ["fedavg", "fedsgdx"]}, "unknown algorithm 'fedsgdx'"),
        ({"objectives": {"accuracy": "max", "leak_psnr": "min"}}, "cannot report 'leak_psnr'"),
        ({"objectives": {"global_accuracy": "max"}}, "local cannot report 'global_accuracy'"),
        ({"num_samples": 0}, "num_samples"),
        ({"objectives": {"accuracy": "up"}}, "objectives.0.direction"),
        ({"base": {"rounds": 0}}, "base.rounds"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_malformed_spec_exits_2_before_ray(
    data_root: Path, tmp_path: Path, over: dict, needle: str
) -> None:
    path = write_spec(tmp_path, tiny_spec(data_root, **over))
    out = cli(["sweep", str(path)], tmp_path, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert needle in out.stderr
    assert not (tmp_path / "sweeps_out").exists() and not (tmp_path / "mlflow.db").exists()


def test_missing_value_makes_an_unreportable_objective_legal(
    data_root: Path, tmp_path: Path
) -> None:
    from sweeps.spec import load_spec

    spec = tiny_spec(
        data_root,
        objectives=[
            {"name": "accuracy", "direction": "max"},
            {"name": "global_accuracy", "direction": "max", "missing": 0.0},
        ],
    )
    loaded = load_spec(write_spec(tmp_path, spec), ["num_samples=3", "base.rounds=5"])
    assert loaded.objectives[1].missing == 0.0
    assert loaded.num_samples == 3 and loaded.base.rounds == 5


def test_export_writes_one_row_per_trial_and_rejects_unknown_experiments(
    data_root: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(
        data_root,
        algorithms=["local"],
        num_samples=1,
        scheduler={"name": "asha", "metric": "accuracy", "mode": "max"},
    )
    path = write_spec(tmp_path, spec)
    assert cli(["sweep", str(path)], tmp_path).returncode == 0
    out = cli(["export", "--experiment", "sweep-tests", "--out", "res.parquet"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    df = pd.read_parquet(tmp_path / "res.parquet")
    assert len(df) == 1 and df["status"].iloc[0] == "FINISHED"
    assert df["algorithm"].iloc[0] == "local" and df["bytes_up"].iloc[0] == 0
    assert {"params.lr", "params.local_epochs", "duration_s", "accuracy"} <= set(df.columns)
    bad = cli(["export", "--experiment", "nope", "--out", "x.parquet"], tmp_path)
    assert bad.returncode == 2 and "unknown MLflow experiment 'nope'" in bad.stderr
