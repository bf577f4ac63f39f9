"""`fedsweep run` end to end: the real console script, a real sqlite MLflow store, Parquet."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.integration.sweep_helpers import cli, cli_in_process


def test_run_json_mlflow_and_parquet(tiny_config: dict, tmp_path: Path) -> None:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config | {"output_dir": "runs"}))
    out = cli(
        [
            "run",
            str(cfg),
            "--set",
            "rounds=2",
            "--set",
            "optimizer.momentum=0.9",
            "--set",
            "workers=2",
            "--json",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)  # stdout holds exactly one JSON document
    assert out.stdout.count("\n") == 1
    assert {
        "accuracy",
        "global_accuracy",
        "rounds",
        "seconds",
        "run_id",
        "metrics_path",
        "bytes_up",
        "bytes_down",
    } <= set(doc)
    assert 0 <= doc["accuracy"] <= 1 and 0 <= doc["global_accuracy"] <= 1
    assert doc["rounds"] == 2

    rows = pd.read_parquet(doc["metrics_path"])
    assert list(rows["round"]) == [1, 2]
    assert {
        "accuracy",
        "global_accuracy",
        "round_bytes_up",
        "round_seconds",
        "bytes_up",
        "seconds",
        "run_id",
    } <= set(rows.columns)
    assert rows["accuracy"].iloc[-1] == pytest.approx(doc["accuracy"])

    from mlflow.tracking import MlflowClient

    assert (tmp_path / "mlflow.db").is_file()
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(doc["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm"] == "fedavg"
    assert run.data.params["optimizer.momentum"] == "0.9"
    assert run.data.params["partition.name"] == "dominant"
    assert run.data.metrics["accuracy"] == pytest.approx(doc["accuracy"])
    assert run.data.metrics["bytes_up"] == doc["bytes_up"]
    for tag in ("fedsweep.version", "fedsweep.git_commit", "torch.version", "dataset.sha256"):
        assert run.data.tags[tag]
    assert run.data.tags["dp_guarantee"] == doc["dp_guarantee"] == "none"  # no DP: eps inf
    history = client.get_metric_history(doc["run_id"], "round_seconds")
    assert sorted(m.step for m in history) == [1, 2]
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.name == "tests"  # from the config's `experiment`
    found = client.search_runs([exp.experiment_id], "params.algorithm = 'fedavg'")
    assert [r.info.run_id for r in found] == [doc["run_id"]]


def test_experiment_name_falls_back_to_env(tiny_config: dict, tmp_path: Path) -> None:
    raw = {k: v for k, v in tiny_config.items() if k != "experiment"}
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(raw | {"rounds": 1, "algorithm": "local"}))
    # in this process: the console script's start-up is test_run_json_mlflow_and_parquet's
    out = cli_in_process(["run", str(cfg), "--json"], tmp_path, MLFLOW_EXPERIMENT_NAME="from-env")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["global_accuracy"] is None and doc["bytes_up"] == 0

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(doc["run_id"])
    assert client.get_experiment(run.info.experiment_id).name == "from-env"
    assert "global_accuracy" not in run.data.metrics


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("lr=0", "lr"),
        ("rounds=0", "rounds"),
        ("client_fraction=2", "client_fraction"),
        ("algorithm=nope", "algorithm"),
        ("bogus=1", "bogus"),
        ("dataset=mnist9", "dataset"),
    ],
)
def test_bad_config_exits_2_and_writes_nothing(
    tiny_config: dict, tmp_path: Path, override: str, needle: str
) -> None:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config))
    out = cli_in_process(["run", str(cfg), "--set", override, "--json"], tmp_path)
    assert out.returncode == 2
    assert out.stdout == ""
    assert needle in out.stderr and "invalid config" in out.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


def test_the_console_script_exits_2_on_a_bad_config(tiny_config: dict, tmp_path: Path) -> None:
    """The refusals above run in this process; one goes through the console script."""
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config))
    out = cli(["run", str(cfg), "--set", "algorithm=nope", "--json"], tmp_path)
    assert out.returncode == 2
    assert out.stdout == ""
    assert "algorithm" in out.stderr and "invalid config" in out.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("capacity", "needle"),
    [
        ({"name": "uniform", "low": 0.001, "high": 1.0}, "below p_min^2"),
        ({"name": "uniform", "low": 0.5, "high": 0.2}, "high (0.2) < low (0.5)"),
        ({"name": "ideal", "p_min": 0.015625}, "conv1"),
    ],
)
def test_bad_capacity_exits_2_and_writes_nothing(
    tiny_config: dict, tmp_path: Path, capacity: dict, needle: str
) -> None:
    cfg = tmp_path / "exp.yaml"
    raw = tiny_config | {"model": "pa3dfl_cnn_fmnist", "capacity": capacity}
    cfg.write_text(yaml.safe_dump(raw))
    out = cli_in_process(["run", str(cfg), "--json"], tmp_path)
    assert out.returncode == 2
    assert out.stdout == ""
    assert needle in out.stderr and "capacity" in out.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


def test_list_prints_registered_names(tmp_path: Path) -> None:
    out = cli(["list", "algorithms"], tmp_path)  # the console script once, then in this process
    assert out.returncode == 0 and {"fedavg", "local"} <= set(out.stdout.split())
    out = cli_in_process(["list", "partitioners"], tmp_path)
    assert set(out.stdout.split()) >= {"iid", "dirichlet", "pathological", "dominant"}
    out = cli_in_process(["list", "datasets"], tmp_path)
    assert set(out.stdout.split()) >= {"fmnist", "emnist", "cifar10", "cifar100", "svhn", "cinic10"}


def test_hyperfl_run_logs_its_client_embeddings(tiny_config: dict, tmp_path: Path) -> None:
    cfg = tmp_path / "exp.yaml"
    raw = tiny_config | {
        "output_dir": "runs",
        "algorithm": "hyperfl",
        "rounds": 1,
        "algorithm_params": {"embed_dim": 8, "hidden_dim": 16},
    }
    cfg.write_text(yaml.safe_dump(raw))
    out = cli_in_process(["run", str(cfg), "--json"], tmp_path)  # the run's products under test
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["global_accuracy"] is None and doc["dp_guarantee"] == "none"
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    names = {a.path for a in client.list_artifacts(doc["run_id"])}
    assert {"client_embeddings.npy", "client_embeddings.png", "metrics.parquet"} <= names
    local = client.download_artifacts(doc["run_id"], "client_embeddings.npy", str(tmp_path))
    emb = np.load(local)
    assert emb.shape == (tiny_config["num_clients"], 8)
    png = client.download_artifacts(doc["run_id"], "client_embeddings.png", str(tmp_path))
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sigterm_ends_a_run_killed_with_its_measured_rounds(
    tiny_config: dict, tmp_path: Path
) -> None:
    """`kill` (SIGTERM) ends `fedsweep run` as Ctrl-C does: the MLflow run is closed KILLED,
    not left RUNNING, and the rounds measured so far are kept."""
    import signal
    import time

    from mlflow.tracking import MlflowClient

    from tests.integration.sweep_helpers import start_cli

    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config | {"rounds": 500}))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    proc = start_cli(["run", str(cfg)], tmp_path)
    try:
        deadline = time.monotonic() + 240
        run_id = None
        while time.monotonic() < deadline and proc.poll() is None and run_id is None:
            time.sleep(1)
            exp = (tmp_path / "mlflow.db").exists() and client.get_experiment_by_name("tests")
            for r in client.search_runs([exp.experiment_id]) if exp else []:
                if len(client.get_metric_history(r.info.run_id, "accuracy")) >= 2:
                    run_id = r.info.run_id
        assert run_id is not None and proc.poll() is None, "the run did not get going"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, err
    run = client.get_run(run_id)
    assert run.info.status == "KILLED", err
    rows = pd.read_parquet(Path(tiny_config["output_dir"]) / run_id / "metrics.parquet")
    assert len(rows) >= 2 and list(rows["round"]) == list(range(1, len(rows) + 1))
