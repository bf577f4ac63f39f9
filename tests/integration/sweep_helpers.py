"""Helpers for the sweep tests: a tiny spec on real FMNIST, the CLI as a subprocess (or in this
process, where only the command's own work is under test), MLflow."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
FEDSWEEP = shutil.which("fedsweep") or str(Path(sys.executable).parent / "fedsweep")


def free_port() -> int:
    """A 127.0.0.1 port free now (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tiny_spec(data_root: Path, **over: Any) -> dict[str, Any]:
    spec = {
        "name": "t",
        "base": {
            "experiment": "sweep-tests",
            "dataset": "fmnist",
            "data_root": str(data_root),
            "num_clients": 4,
            "global_test_per_class": 50,
            "samples_per_client": 100,
            "test_samples_per_client": 100,
            "rounds": 2,
            "local_epochs": 1,
            "eval_every": 1,
            "partition": {"name": "dominant"},
        },
        "algorithms": ["fedavg", "local"],
        "objectives": {"accuracy": "max", "bytes_up": "min"},
        "num_samples": 2,
        "max_concurrent_trials": 2,
        "sampler": {"name": "random", "seed": 1},
        "storage": {"path": "sweeps_out"},
        "ray": {"num_cpus": 2},
    }
    spec.update(over)
    return spec


def write_spec(tmp: Path, spec: dict[str, Any]) -> Path:
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


#: not passed on: the CLI's own defaults must hold, not what this process set (opening a store
#: sets the progress-bar default in os.environ)
_NOT_INHERITED = {
    "MLFLOW_TRACKING_URI",
    "MLFLOW_EXPERIMENT_NAME",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR",
}


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}
    base["PYTHONPATH"] = str(ROOT) + os.pathsep + base.get("PYTHONPATH", "")
    base["RAY_USAGE_STATS_ENABLED"] = "0"
    return base | extra


def cli(
    args: list[str], cwd: Path, timeout: int = 600, **extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [FEDSWEEP, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(**extra),
    )


def start_cli(args: list[str], cwd: Path, **extra: str) -> subprocess.Popen[str]:
    """The console script started in the background from ``cwd`` (stdout and stderr piped, as
    text): for tests that signal or watch a command while it runs."""
    return subprocess.Popen(
        [FEDSWEEP, *args],
        cwd=cwd,
        env=env(**extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class InProcess:
    """What :func:`cli_in_process` returns: the fields of a ``CompletedProcess`` tests read."""

    def __init__(self, result: Any) -> None:
        self.returncode: int = result.exit_code
        self.stdout: str = result.stdout
        self.stderr: str = result.stderr


def cli_in_process(args: list[str], cwd: Path, **env: str) -> InProcess:
    """The CLI in this process, from ``cwd``, with no tracking variables set but ``env``'s: for
    checks of a command's own behaviour (refusals above all, and runs whose products are under
    test), where the console script's start-up (imports, about 5 CPU-seconds a call) is covered
    by the tests that run it."""
    import pytest
    from typer.testing import CliRunner

    from sweeps.cli import app

    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryFile("w+") as fd1:
        mp.chdir(cwd)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
        for key, value in env.items():
            mp.setenv(key, value)
        # ``--json`` writes its document to file descriptor 1, past the runner's sys.stdout
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(fd1.fileno(), 1)
        try:
            out = InProcess(CliRunner().invoke(app, args))
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        fd1.seek(0)
        out.stdout = fd1.read() + out.stdout
        return out


def client(tmp: Path) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")


def child_runs(tmp: Path, experiment: str = "sweep-tests") -> list[Any]:
    c = client(tmp)
    exp = c.get_experiment_by_name(experiment)
    runs = c.search_runs([exp.experiment_id], max_results=1000)
    return [r for r in runs if r.data.tags.get("fedsweep.kind") != "sweep"]


def study_states(tmp: Path, name: str = "t") -> list[str]:
    import optuna

    study = optuna.load_study(
        study_name=name, storage=f"sqlite:///{tmp / 'sweeps_out' / f'{name}.optuna.db'}"
    )
    return [t.state.name for t in study.trials]
