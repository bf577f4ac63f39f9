"""Sweeps on the embedded Ray: real trials on real FMNIST, a real MLflow store and Optuna RDB."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.runs import unsanitize as _unsanitize
from tests.integration.sweep_helpers import (
    child_runs,
    cli,
    cli_in_process,
    client,
    env,
    study_states,
    tiny_spec,
    write_spec,
)


def test_two_trial_sweep_parent_children_parquet_study_and_a_refused_resume(
    data_root: Path, tmp_path: Path
) -> None:
    # sampler seed 0 draws local, then fedavg (seed 1, the helper's, draws local twice)
    # checkpoint.every auto with an hour between saves: each trial saves at its end only, however
    # slowly a loaded machine runs it (at 60 s, the default, a trial slowed 30x saved twice)
    # one trial at a time: the second runs in the first one's Ray worker (reuse_actors)
    spec = tiny_spec(
        data_root,
        sampler={"name": "random", "seed": 0},
        checkpoint={"every": "auto", "min_seconds": 3600},
        max_concurrent_trials=1,
    )
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
    # checkpoint.every auto: saved at their end only
    trial_dirs = [d for d in (tmp_path / "sweeps_out" / "t").iterdir() if d.is_dir()]
    assert len(trial_dirs) == 2
    for d in trial_dirs:
        assert sorted(p.name for p in d.glob("checkpoint_*")) == ["checkpoint_000000"], d
    pids = {
        json.loads(line)["pid"]
        for d in trial_dirs
        for line in (d / "result.json").read_text().splitlines()
    }
    assert len(pids) == 1, pids  # one worker process ran both trials

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
            # the sweep default schedule [first, middle, last] is rounds 1 and 2 here; the run's
            # figure is over every attacked record, the history keeps each round's own
            assert run.data.metrics["leak_images"] == 2
            hist = c.get_metric_history(run.info.run_id, "leak_psnr")
            per_round = {m.step: m.value for m in hist if m.step == 1}
            per_round |= {2: min((m for m in hist if m.step == 2), key=lambda m: m.timestamp).value}
            assert len(hist) == 3 and run.data.metrics["leak_psnr"] == pytest.approx(
                (per_round[1] + per_round[2]) / 2
            )
            assert per_round[1] != per_round[2]
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
    assert "Downloading artifacts" not in report.stderr  # no tqdm bar per attack grid read
    html = (tmp_path / "report.html").read_text()
    assert "Sweep <code>t</code>" in html and "sweep_spec.json" in html
    assert doc["parent_run_id"][:8] in html and "not started by a sweep" not in html
    assert all(t["run_id"][:8] in html for t in doc["trials"])

    # --resume with changed settings is refused (this sweep's state, not a second sweep's):
    # exit 2, the changed keys named, nothing written, Ray not reached
    record = json.loads((tmp_path / "sweeps_out" / "t.spec.json").read_text())
    assert record["spec"]["base"]["rounds"] == 2 and record["optuna"] == "sqlite"
    # the sweep's own Optuna store, not the shared optuna.db of earlier versions
    assert (tmp_path / "sweeps_out" / "t.optuna.db").is_file()
    assert not (tmp_path / "sweeps_out" / "optuna.db").exists()
    before = _files(tmp_path)
    refused = cli(
        [
            "sweep",
            str(path),
            "--resume",
            *("--set", "base.rounds=3", "--set", "seeds=[0, 1]"),
            *("--set", "max_concurrent_trials=2"),  # may differ: not named
            *("--address", "auto"),  # may differ (and would fail if Ray were reached: no cluster)
        ],
        tmp_path,
        RAY_TMPDIR=str(tmp_path / "ray"),
    )
    err = " ".join(refused.stderr.split())
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "base.rounds: 2 -> 3" in err and "seeds: [0] -> [0, 1]" in err
    assert "max_concurrent_trials:" not in err and "ray.address:" not in err
    assert _files(tmp_path) == before  # no store, state, record or MLflow row changed
    assert c.get_run(doc["parent_run_id"]).info.status == "FINISHED"


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def _optuna_trials(tmp: Path, name: str = "t") -> list:
    import optuna

    return optuna.load_study(
        study_name=name, storage=f"sqlite:///{tmp / 'sweeps_out' / f'{name}.optuna.db'}"
    ).trials


def test_trial_lifecycle_each_outcome_is_the_same_in_optuna_and_mlflow(
    data_root: Path, tmp_path: Path
) -> None:
    """One sweep, every way a trial can end: finished (epsilon inf, told a stand-in), an
    objective never measured, diverged, errored, stopped early by ASHA."""
    spec = tiny_spec(
        data_root,
        algorithms=[
            "fedavg_steady",
            "fedavg_unmeasured",
            "fedavg_lossy",
            "fedavg_diverges",
            "fedavg_raises",
        ],
        objectives=[
            {"name": "accuracy", "direction": "max"},
            {"name": "epsilon", "direction": "min"},
            # only fedavg_unmeasured can report it: the others take the declared 0.0
            {"name": "fault_metric", "direction": "min", "missing": 0.0},
        ],
        num_samples=5,
        max_failures=1,
        # ASHA ranks on train_loss: fedavg_lossy (+1000) is stopped at its first rung, the two
        # identical fixed-lr runs (steady, unmeasured) tie and go on
        scheduler={"name": "asha", "metric": "train_loss", "mode": "min"},
        # seed 20 draws unmeasured, steady, diverges, raises, lossy: lossy starts after a
        # steady run has recorded its first rung
        sampler={"name": "random", "seed": 20},
    )
    out = cli(
        ["sweep", str(write_spec(tmp_path, spec)), "--json"],
        tmp_path,
        FEDSWEEP_PLUGINS="tests.plugins.faults",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    runs = {r.data.tags["algorithm"]: r for r in child_runs(tmp_path)}
    assert len(child_runs(tmp_path)) == 5 and len(runs) == 5, runs.keys()
    told = {t.number: t for t in _optuna_trials(tmp_path)}
    assert len(told) == 5

    expected = {  # algorithm: (Optuna state, MLflow status, status tag, failure_reason)
        "fedavg_steady": ("COMPLETE", "FINISHED", "FINISHED", None),
        "fedavg_unmeasured": ("FAIL", "FAILED", "FAILED", "objective not measured: fault_metric"),
        "fedavg_diverges": ("FAIL", "FAILED", "FAILED", "diverged"),
        "fedavg_raises": ("FAIL", "FAILED", "FAILED", "error"),
        "fedavg_lossy": ("PRUNED", "KILLED", "PRUNED", None),
    }
    for algorithm, (state, status, tag, reason) in expected.items():
        run = runs[algorithm]
        tags = run.data.tags
        # §4.4: the stores point at each other
        trial = told[int(tags["fedsweep.optuna_trial"])]
        assert trial.params["algorithm"] == algorithm
        assert trial.user_attrs["fedsweep.mlflow_run_id"] == run.info.run_id
        assert trial.user_attrs["fedsweep.tune_trial_id"] == tags["fedsweep.trial_id"]
        assert (trial.state.name, run.info.status, tags["status"]) == (state, status, tag)
        assert tags.get("failure_reason") == reason, (algorithm, tags.get("failure_reason"))
        if algorithm != "fedavg_raises":  # tagged from the first result (raises reports none)
            assert tags["dp_guarantee"] == "none"  # the trial's privacy_tags, each a tag
    # ASHA: stopped after its first rung of two, never FINISHED
    lossy = runs["fedavg_lossy"].data.tags
    assert lossy["stopped_early"] == "true" and lossy["rounds_completed"] == "1"
    assert runs["fedavg_steady"].data.tags["rounds_completed"] == "2"
    assert "stopped_early" not in runs["fedavg_steady"].data.tags
    # the unmeasured objective was not invented: absent in MLflow, not the 0.0 of the others
    assert "fault_metric" not in runs["fedavg_unmeasured"].data.metrics
    assert runs["fedavg_steady"].data.metrics["fault_metric"] == 0.0
    # epsilon inf: MLflow keeps inf, Optuna was told the finite stand-in (no DP space: 1000)
    steady = told[int(runs["fedavg_steady"].data.tags["fedsweep.optuna_trial"])]
    assert _unsanitize(runs["fedavg_steady"].data.metrics["epsilon"]) == float("inf")
    assert steady.values[1] == 1000.0
    assert steady.user_attrs["fedsweep.inf_stand_ins"] == {"epsilon": 1000.0}
    assert steady.values[0] == runs["fedavg_steady"].data.metrics["accuracy"]
    # errors are retried (max_failures), divergence is not
    assert runs["fedavg_raises"].data.tags["retries"] == "1"
    assert "injected failure" in runs["fedavg_raises"].data.tags["error"]
    assert "retries" not in runs["fedavg_diverges"].data.tags
    # the parquet export and the summary see the same outcomes
    doc = json.loads(out.stdout)
    assert sorted(t["status"] for t in doc["trials"]) == sorted(
        ["FINISHED", "FAILED", "FAILED", "FAILED", "KILLED"]
    )
    assert doc["reconciled"] == {
        "closed_trials": 0,
        "synced_runs": 0,
        "created_runs": 0,
        "lost_runs": 0,
    }


def test_dry_run_starts_no_ray(data_root: Path, tmp_path: Path) -> None:
    spec = tiny_spec(data_root)
    spec["objectives"] = {"accuracy": "max", "epsilon": "min"}
    path = write_spec(tmp_path, spec)
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
    # fedavg and local search no target epsilon: epsilon's stand-in is the fallback
    assert plan["inf_values"] == {"accuracy": None, "epsilon": 1000.0}
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
        # the tracking store (sweeps.preflight): a scheme SQLAlchemy dropped, a server that is
        # not there (nothing listens on port 1)
        ({"tracking": {"uri": "postgres://u@127.0.0.1:1/mlflow"}}, "write postgresql://"),
        ({"tracking": {"uri": "http://127.0.0.1:1"}}, "127.0.0.1:1 does not answer"),
    ],
)
def test_malformed_spec_exits_2_before_ray(
    data_root: Path, tmp_path: Path, over: dict, needle: str
) -> None:
    """In this process (the console script's refusal: the two-trial sweep's
    refused resume): exit 2 naming the
    problem, nothing written, Ray not started."""
    path = write_spec(tmp_path, tiny_spec(data_root, **over))
    out = cli_in_process(["sweep", str(path)], tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert needle in " ".join(out.stderr.split()), out.stderr[-2000:]  # rich wraps lines
    assert not (tmp_path / "sweeps_out").exists() and not (tmp_path / "mlflow.db").exists()
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


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


def test_a_capacity_trial_logs_its_clients_costs_and_exports_one_row(
    data_root: Path, tmp_path: Path
) -> None:
    """Under a capacity setting a trial's child run holds ``client_costs.json`` and the costs per
    width, as ``fedsweep run`` does; ``export`` writes its one row (an ASHA-scheduled trial that
    ran to the end is FINISHED) and rejects an unknown experiment. One sweep for both: each
    costs ~20 s of the default run."""
    spec = tiny_spec(
        data_root,
        algorithms=["local"],
        num_samples=1,
        max_concurrent_trials=1,
        scheduler={"name": "asha", "metric": "accuracy", "mode": "max"},
    )
    spec["base"] |= {
        "model": "pa3dfl_cnn_fmnist",
        "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 0.25, 0.0625]},
        "rounds": 1,
        "global_test_per_class": 20,
    }
    path = write_spec(tmp_path, spec)
    out = cli(["sweep", str(path), "--json"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (run,) = child_runs(tmp_path)
    c = client(tmp_path)
    local = Path(c.download_artifacts(run.info.run_id, "client_costs.json", str(tmp_path)))
    costs = json.loads(local.read_text())
    assert [costs[str(i)]["capacity_width"] for i in range(4)] == [1.0, 0.5, 0.5, 0.25]
    # Local-only is capacity-aware: each client trains its own width
    assert costs["0"]["params"] > costs["1"]["params"] > costs["3"]["params"]
    # the exports in this process (the console script's start-up is other tests')
    out = cli_in_process(
        ["export", "--experiment", "sweep-tests", "--out", "res.parquet"], tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    df = pd.read_parquet(tmp_path / "res.parquet")
    assert len(df) == 1 and df["status"].iloc[0] == "FINISHED"
    assert df["algorithm"].iloc[0] == "local" and df["bytes_up"].iloc[0] == 0
    assert {"params.lr", "params.local_epochs", "duration_s", "accuracy"} <= set(df.columns)
    bad = cli_in_process(["export", "--experiment", "nope", "--out", "x.parquet"], tmp_path)
    assert bad.returncode == 2 and "unknown MLflow experiment 'nope'" in bad.stderr
    metrics = run.data.metrics
    assert metrics["params_width_1"] == costs["0"]["params"]
    assert metrics["flops_width_0.25"] == costs["3"]["flops"]
    assert metrics["accuracy_worst_width"] <= metrics["accuracy_width_1"]
