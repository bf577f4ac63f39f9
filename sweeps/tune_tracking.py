"""MLflow from the sweep driver: one parent run per sweep, one child run per trial.

Every MLflow write happens here, in a Tune callback on the driver, never in a trial worker:
workers on other machines cannot reach a sqlite file, concurrent sqlite writers lock each other,
and Ray changes each trial's working directory. Ray's own MLflowLoggerCallback is not used: on
resume it opens duplicate runs and leaves the old ones RUNNING. Here the trial -> run mapping is
kept in a JSON file beside Tune's experiment state, so a resumed trial continues its own run.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from ray.tune import Callback

from flcore.config import flatten

__all__ = ["MLflowDriverCallback", "SweepState"]

_SKIP = {
    "done",
    "training_iteration",
    "trial_id",
    "date",
    "timestamp",
    "time_this_iter_s",
    "time_total_s",
    "pid",
    "hostname",
    "node_ip",
    "time_since_restore",
    "iterations_since_restore",
    "checkpoint_dir_name",
    "should_checkpoint",
    "config",
    "round",
    "device",
    "algorithm",
    "diverged",
    "node_id",
    "attack_grid_png",
}


class SweepState:
    """The driver's small persistent record: parent run id and trial -> child run id."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.data: dict[str, Any] = {"parent_run_id": None, "trials": {}}
        if self.path.is_file():
            self.data = json.loads(self.path.read_text())

    @property
    def parent_run_id(self) -> str | None:
        return self.data.get("parent_run_id")

    def run_for(self, trial_id: str) -> str | None:
        return self.data["trials"].get(trial_id)

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.save()

    def bind(self, trial_id: str, run_id: str) -> None:
        self.data["trials"][trial_id] = run_id
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)


def _metrics(result: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in result.items():
        if key in _SKIP or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if not math.isnan(float(value)):
            out[key] = float(value)
    return out


class MLflowDriverCallback(Callback):
    """Creates, fills and closes the child run of every trial, in the driver.

    Args:
        uri: absolute MLflow tracking URI.
        experiment_id: the MLflow experiment.
        state_path: the :class:`SweepState` file (holds the parent run id).
        sweep_name: tag value.
        trial_params: ``config -> flat params`` for a trial (the experiment it runs).
        dataset: tag value.
    """

    def __init__(
        self,
        *,
        uri: str,
        experiment_id: str,
        state_path: str,
        sweep_name: str,
        trial_params: Any,
        dataset: str,
    ) -> None:
        self.uri, self.experiment_id = uri, experiment_id
        self.state_path, self.sweep_name, self.dataset = state_path, sweep_name, dataset
        self.trial_params = trial_params
        self._client: Any = None
        self._state: SweepState | None = None
        self._tagged: set[str] = set()

    # Ray pickles callbacks with the experiment state: keep only plain fields.
    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in {"_client", "_state"}} | {
            "_client": None,
            "_state": None,
            "_tagged": set(),
        }

    @property
    def client(self) -> Any:
        if self._client is None:
            from sweeps.tracking import mlflow_client

            self._client = mlflow_client(self.uri)
        return self._client

    @property
    def state(self) -> SweepState:
        if self._state is None:
            self._state = SweepState(self.state_path)
        return self._state

    def _run_id(self, trial: Any) -> str:
        run_id = self.state.run_for(trial.trial_id)
        if run_id is not None:
            return run_id
        from mlflow.entities import Param

        config = {k: v for k, v in trial.config.items()}
        algorithm = config.get("algorithm", "?")
        tags = {
            "mlflow.parentRunId": self.state.parent_run_id or "",
            "fedsweep.sweep": self.sweep_name,
            "fedsweep.trial_id": trial.trial_id,
            "algorithm": algorithm,
            "dataset": self.dataset,
            "status": "RUNNING",
        }
        run = self.client.create_run(
            self.experiment_id, run_name=f"{algorithm}-{trial.trial_id}", tags=tags
        )
        params = [Param(k, str(v)[:6000]) for k, v in flatten(self.trial_params(config)).items()]
        params.append(Param("trial.search_params", json.dumps(config, default=str)[:6000]))
        for i in range(0, len(params), 100):
            self.client.log_batch(run.info.run_id, params=params[i : i + 100])
        self.state.bind(trial.trial_id, run.info.run_id)
        return run.info.run_id

    def _tags(self, run_id: str, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        run_id = self._run_id(trial)
        self.client.update_run(run_id, status="RUNNING")

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        from mlflow.entities import Metric

        run_id = self._run_id(trial)
        step = int(result.get("round", iteration))
        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in _metrics(result).items()]
        self.client.log_batch(run_id, metrics=metrics)
        if result.get("attack_grid_png"):
            self._log_grid(run_id, result["attack_grid_png"])
        if trial.trial_id not in self._tagged:  # once per trial and driver
            self._tagged.add(trial.trial_id)
            self._tags(
                run_id,
                {
                    "node_ip": result.get("node_ip", ""),
                    "node_id": result.get("node_id", ""),
                    "device": result.get("device", ""),
                    "dp_guarantee": result.get("dp_guarantee", ""),
                },
            )

    def _log_grid(self, run_id: str, png_base64: str) -> None:
        """A trial's attack image grid (sent as base64 in its result) as the run's artifact."""
        import base64
        import tempfile

        from sweeps.attack_artifacts import ATTACK_GRID_DIR

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "reconstructions.png"
            path.write_bytes(base64.b64decode(png_base64))
            self.client.log_artifact(run_id, str(path), ATTACK_GRID_DIR)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        """Close the runs of trials Tune no longer knows (once every trial has ended).

        A driver killed with SIGKILL can lose a trial that Tune had started but not yet saved in
        its experiment state; the resumed sweep runs a replacement. The lost trial's run is
        closed as KILLED and tagged ``fedsweep.lost_trial`` (kept, never deleted; exports leave
        it out), so no run stays RUNNING and each trial of the sweep has exactly one run.
        """
        if any(t.status not in ("TERMINATED", "ERROR") for t in trials):
            return  # interrupted: a later --resume finishes these trials
        known = {t.trial_id for t in trials}
        for trial_id, run_id in self.state.data["trials"].items():
            if trial_id in known:
                continue
            if self.client.get_run(run_id).info.status == "RUNNING":
                self._tags(
                    run_id,
                    {
                        "status": "KILLED",
                        "fedsweep.lost_trial": "true",
                        "failure_reason": "lost: the driver was killed before "
                        "Tune saved this trial; the sweep ran a replacement",
                    },
                )
                self.client.set_terminated(run_id, status="KILLED")

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A failed attempt that Ray will retry from the trial's last checkpoint."""
        run_id = self._run_id(trial)
        retries = int(self.client.get_run(run_id).data.tags.get("retries", "0")) + 1
        self._tags(run_id, {"retries": retries})

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        run_id = self._run_id(trial)
        last = trial.last_result or {}
        if last.get("diverged"):
            self._tags(run_id, {"status": "FAILED", "failure_reason": "diverged"})
            self.client.set_terminated(run_id, status="FAILED")
            return
        self._tags(run_id, {"status": "FINISHED"})
        self.client.set_terminated(run_id, status="FINISHED")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        run_id = self._run_id(trial)
        error = ""
        try:
            if trial.error_file and Path(trial.error_file).is_file():
                error = Path(trial.error_file).read_text()
        except OSError:
            pass
        self._tags(
            run_id,
            {
                "status": "FAILED",
                "failure_reason": "error",
                "error": error[-4000:] or "trial raised an error",
            },
        )
        self.client.set_terminated(run_id, status="FAILED")
