"""MLflow from the sweep driver: one parent run per sweep, one child run per trial.

Every MLflow write happens here, in a Tune callback on the driver, never in a trial worker:
workers on other machines cannot reach a sqlite file, concurrent sqlite writers lock each other,
and Ray changes each trial's working directory. Ray's own MLflowLoggerCallback is not used: on
resume it opens duplicate runs and leaves the old ones RUNNING. Here the trial -> run mapping is
kept in a JSON file beside Tune's experiment state, so a resumed trial continues its own run.

The Optuna study is the record of each trial's outcome (:mod:`sweeps.search` tells it before Tune
calls this callback): a child run's final MLflow status and its ``status`` tag are those of its
Optuna trial (COMPLETE: FINISHED; FAIL: FAILED with ``failure_reason``; PRUNED: MLflow KILLED,
tag ``status=PRUNED``, ``stopped_early=true``), so the two stores cannot disagree, also for a trial
re-run after a driver restart. Every run carries ``rounds_completed``, the tags of its algorithm's
``privacy_tags()`` and ``fedsweep.optuna_trial`` (its Optuna trial number); the Optuna trial gets
``fedsweep.mlflow_run_id`` (§4.4).

Child runs are created idempotently (§4.1): before creating one, the driver looks for a run of
the trial under the parent (tag ``fedsweep.trial_id``, else ``fedsweep.optuna_trial``: a trial
asked before a driver was killed and taken over after the resume keeps its run). A driver killed
between ``create_run`` and saving the trial -> run map thus leaves no orphan RUNNING run.
:meth:`MLflowDriverCallback.reconcile` runs once a sweep is complete and makes the two stores
agree on trials that Tune never told this callback about (finished after Tune's last save).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from ray.tune import Callback

from flcore.config import flatten
from sweeps.driver_time import driver_time, mark
from sweeps.mlflow_writer import BackgroundWriter
from sweeps.search import (
    ATTR_MLFLOW_RUN,
    ATTR_REASON,
    ATTR_ROUNDS,
    MLFLOW_OF_STATE,
    OutcomeRule,
    StudyLink,
)

__all__ = ["MLflowDriverCallback", "SweepState", "trial_error"]

_SKIP = {
    "done",
    "last_round_values",
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
    "client_costs_json",
    "privacy_tags",
    "dp_guarantee",
    "rounds_completed",
    "rounds_total",
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


def trial_error(trial: Any) -> str:
    """The traceback Tune saved for a failed trial (its error file), or ""."""
    try:
        if trial.error_file and Path(trial.error_file).is_file():
            return Path(trial.error_file).read_text()
    except OSError:
        pass
    return ""


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
        study: the sweep's Optuna study (the record of outcomes); None: outcomes are judged
            here from the last result by ``rule``.
        rule: the sweep's objectives, for a trial without an Optuna verdict.
    """

    # defaults for a callback unpickled from a sweep started before these existed
    study: StudyLink | None = None
    rule: OutcomeRule | None = None

    def __init__(
        self,
        *,
        uri: str,
        experiment_id: str,
        state_path: str,
        sweep_name: str,
        trial_params: Any,
        dataset: str,
        study: StudyLink | None = None,
        rule: OutcomeRule | None = None,
    ) -> None:
        self.uri, self.experiment_id = uri, experiment_id
        self.state_path, self.sweep_name, self.dataset = state_path, sweep_name, dataset
        self.trial_params = trial_params
        self.study, self.rule = study, rule
        self._client: Any = None
        self._writer: BackgroundWriter | None = None
        self._state: SweepState | None = None
        self._tagged: set[str] = set()
        self._settled: set[str] = set()
        # per trial: the highest step this driver logged, and the step up to which a trial
        # restored from an older checkpoint re-reports what is already logged (not logged again)
        self._logged: dict[str, int] = {}
        self._floor: dict[str, int] = {}
        # Tune trial id -> its Optuna trial's storage id, once found in this driver (a Tune
        # trial keeps its Optuna trial: the searcher links them at the trial's first suggest)
        self._optuna_ids: dict[str, int] = {}
        # True only in the driver that started the sweep: no earlier driver can have made a
        # run for one of its trials, so a trial's run is looked up in the store only after a
        # resume (saves two searches and a flush on Tune's loop per trial)
        self.fresh = False

    # Ray pickles callbacks with the experiment state: keep only plain fields. An unpickled
    # callback belongs to a resumed driver: it looks runs up (fresh is False).
    def __getstate__(self) -> dict[str, Any]:
        skip = {"_client", "_state", "_writer"}
        return {k: v for k, v in self.__dict__.items() if k not in skip} | {
            "_client": None,
            "_writer": None,
            "_state": None,
            "_tagged": set(),
            "_settled": set(),
            "_logged": {},
            "_floor": {},
            "_optuna_ids": {},
            "fresh": False,
        }

    @property
    def client(self) -> Any:
        if self._client is None:
            from sweeps.tracking import mlflow_client

            self._client = mlflow_client(self.uri)
        return self._client

    @property
    def writer(self) -> BackgroundWriter:
        """The background writer of this driver's MLflow writes (sweeps.mlflow_writer)."""
        if getattr(self, "_writer", None) is None:
            self._writer = BackgroundWriter(self.client)
        return self._writer  # type: ignore[return-value]

    def flush(self) -> None:
        """Wait until every enqueued write is in the store (before reading it back)."""
        if getattr(self, "_writer", None) is not None:
            self._writer.flush()  # type: ignore[union-attr]

    def close(self) -> None:
        """Flush the writes and stop the writer (the sweep's end, Ctrl-C included)."""
        if getattr(self, "_writer", None) is not None:
            writer, self._writer = self._writer, None
            writer.close()  # type: ignore[union-attr]

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        self.flush()

    @property
    def state(self) -> SweepState:
        if self._state is None:
            self._state = SweepState(self.state_path)
        return self._state

    # ------------------------------------------------------------------ runs
    def _optuna_trial(self, trial_id: str) -> Any:
        """The Optuna trial (frozen, current) that Tune trial ``trial_id`` runs, or None: a scan
        of the study the first time, then a read of that one trial (a trial's start, first
        result and end each ask; a finished trial is read from Optuna's cache)."""
        if self.study is None:
            return None
        known = self.__dict__.setdefault("_optuna_ids", {})  # a callback pickled before the memo
        if trial_id in known:
            return self.study.get(known[trial_id])
        found = self.study.find(trial_id)
        if found is not None:
            known[trial_id] = found._trial_id
        return found

    def _child(self, **tags: str) -> str | None:
        """The id of a live child run of this sweep's parent with these tags, or None."""
        parent = self.state.parent_run_id
        if not parent:
            return None
        self.flush()
        clauses = [f"tags.`mlflow.parentRunId` = '{parent}'"]
        clauses += [f"tags.`{k}` = '{v}'" for k, v in tags.items()]
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=" and ".join(clauses),
            max_results=2,
            order_by=["attributes.start_time ASC"],
        )
        return runs[0].info.run_id if runs else None

    def _existing_run(self, trial_id: str, optuna_trial: Any) -> str | None:
        """The child run already made for this trial: by its Tune trial id (a driver killed
        before it saved the map), else by its Optuna trial (a trial taken over after a
        restart, under a new Tune trial id)."""
        run_id = self._child(**{"fedsweep.trial_id": trial_id})
        if run_id is None and optuna_trial is not None:
            linked = optuna_trial.user_attrs.get(ATTR_MLFLOW_RUN)
            run_id = self._child(**{"fedsweep.optuna_trial": str(optuna_trial.number)})
            if run_id is None and linked:
                run_id = linked
            if run_id is not None:
                self._tags(run_id, {"fedsweep.trial_id": trial_id})
        return run_id

    def _run_id(self, trial: Any) -> str:
        run_id = self.state.run_for(trial.trial_id)
        if run_id is not None:
            return run_id
        optuna_trial = self._optuna_trial(trial.trial_id)
        run_id = (
            None
            if getattr(self, "fresh", False)
            else self._existing_run(trial.trial_id, optuna_trial)
        )
        if run_id is None:
            run_id = self._create_run(trial.trial_id, dict(trial.config), optuna_trial)
        self.state.bind(trial.trial_id, run_id)
        if optuna_trial is not None and optuna_trial.user_attrs.get(ATTR_MLFLOW_RUN) != run_id:
            self.study.set_attr(optuna_trial, ATTR_MLFLOW_RUN, run_id)  # type: ignore[union-attr]
        return run_id

    def _create_run(self, trial_id: str, config: dict[str, Any], optuna_trial: Any) -> str:
        from mlflow.entities import Param

        algorithm = config.get("algorithm", "?")
        tags = {
            "mlflow.parentRunId": self.state.parent_run_id or "",
            "fedsweep.sweep": self.sweep_name,
            "fedsweep.trial_id": trial_id,
            "algorithm": algorithm,
            "dataset": self.dataset,
            "status": "RUNNING",
        }
        if optuna_trial is not None:
            tags["fedsweep.optuna_trial"] = str(optuna_trial.number)
        run = self.client.create_run(
            self.experiment_id, run_name=f"{algorithm}-{trial_id}", tags=tags
        )
        params: list[Any] = []
        if "algorithm" in config:
            params = [
                Param(k, str(v)[:6000]) for k, v in flatten(self.trial_params(config)).items()
            ]
        params.append(Param("trial.search_params", json.dumps(config, default=str)[:6000]))
        self.writer.log_batch(run.info.run_id, params=params)  # split to MLflow's limits there
        return str(run.info.run_id)

    def _tags(self, run_id: str, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.writer.log_batch(run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])

    def _close(
        self,
        run_id: str,
        state: str,
        *,
        reason: str | None = None,
        rounds: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """End a run as its Optuna trial ended: ``state`` is COMPLETE, FAIL or PRUNED."""
        status, tag = MLFLOW_OF_STATE[state]
        tags: dict[str, Any] = {"status": tag, **(extra or {})}
        if state == "FAIL":
            tags["failure_reason"] = reason or "error"
        if state == "PRUNED":
            tags["stopped_early"] = "true"
        if rounds is not None:
            tags["rounds_completed"] = rounds
        self._tags(run_id, tags)
        self.writer.call(self.client.set_terminated, run_id, status=status)

    def _close_as_told(
        self,
        trial: Any,
        run_id: str,
        *,
        error: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Close ``run_id`` as the trial's Optuna trial was told; without one, as the rule
        judges the last result."""
        last = trial.last_result or {}
        rounds = last.get("rounds_completed")
        told = self._optuna_trial(trial.trial_id)
        if told is not None and told.state.is_finished():
            self._close(
                run_id,
                told.state.name,
                reason=told.user_attrs.get(ATTR_REASON),
                rounds=told.user_attrs.get(ATTR_ROUNDS, rounds),
                extra={"fedsweep.optuna_trial": told.number, **(extra or {})},
            )
            return
        rule = self.rule or OutcomeRule((), {})
        outcome = rule.outcome(last, error=error)
        self._close(run_id, outcome.state, reason=outcome.reason, rounds=rounds, extra=extra)

    # ------------------------------------------------------------------ Tune hooks
    @driver_time("mlflow")
    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        run_id = self._run_id(trial)
        told = self._optuna_trial(trial.trial_id)
        if told is not None and told.state.is_finished():
            # Tune re-runs a trial that had finished after its last save: the first verdict
            # and the first run's metrics stand.
            self._settled.add(trial.trial_id)
            self._close_as_told(trial, run_id)
            return
        self.writer.call(self.client.update_run, run_id, status="RUNNING")

    @driver_time("mlflow")
    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        from mlflow.entities import Metric

        if trial.trial_id in self._settled:
            return
        run_id = self._run_id(trial)
        step = int(result.get("round", iteration))
        tid = trial.trial_id
        if tid not in self._logged and not getattr(self, "fresh", False):
            # a resumed driver's first result of this trial: what an earlier driver logged
            self._floor[tid] = self._stored_step(run_id)
        if step <= self._floor.get(tid, -1):
            return  # re-run after a restore from an older checkpoint: already logged
        self._logged[tid] = max(step, self._logged.get(tid, -1))
        now = int(time.time() * 1000)
        # the last round's own leakage first (an earlier timestamp at the same step), then the
        # whole-run figures that replace it in the report: MLflow's latest value is the latter
        own = _metrics(result.get("last_round_values") or {})
        metrics = [Metric(k, v, now - 1, step) for k, v in own.items()]
        metrics += [Metric(k, v, now, step) for k, v in _metrics(result).items()]
        self.writer.log_batch(run_id, metrics=metrics)
        if result.get("attack_grid_png"):
            self.writer.call(self._log_grid, run_id, result["attack_grid_png"])
        if result.get("client_costs_json"):
            self.writer.call(
                self._log_text, run_id, "client_costs.json", result["client_costs_json"]
            )
        if trial.trial_id not in self._tagged:  # once per trial and driver
            self._tagged.add(trial.trial_id)
            privacy = result.get("privacy_tags") or {}
            self._tags(
                run_id,
                {
                    "node_ip": result.get("node_ip", ""),
                    "node_id": result.get("node_id", ""),
                    "device": result.get("device", ""),
                    **privacy,
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

    def _log_text(self, run_id: str, name: str, text: str) -> None:
        """A file a trial sent as text in its result, as the run's artifact ``name``."""
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_text(text)
            self.client.log_artifact(run_id, str(path))

    def _stored_step(self, run_id: str) -> int:
        """The highest step of the run's metrics in the store (-1: none)."""
        self.flush()
        keys = sorted(self.client.get_run(run_id).data.metrics)
        if not keys:
            return -1
        key = "train_loss" if "train_loss" in keys else keys[0]
        return max((m.step for m in self.client.get_metric_history(run_id, key)), default=-1)

    @driver_time("mlflow")
    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        """A failed attempt that Ray will retry from the trial's last checkpoint: the steps
        it re-runs up to what this driver logged are not logged twice."""
        self._floor[trial.trial_id] = self._logged.get(trial.trial_id, -1)
        run_id = self._run_id(trial)
        self.flush()
        retries = int(self.client.get_run(run_id).data.tags.get("retries", "0")) + 1
        self._tags(run_id, {"retries": retries})

    @driver_time("mlflow")
    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._close_as_told(trial, self._run_id(trial))
        mark()

    @driver_time("mlflow")
    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        run_id = self._run_id(trial)
        error = trial_error(trial)
        self._close_as_told(
            trial, run_id, error=True, extra={"error": error[-4000:] or "trial raised an error"}
        )
        mark()

    # ------------------------------------------------------------------ the end
    def relog_missing(self, tune_dir: str | Path) -> dict[str, int]:
        """Write back what a killed driver had queued but not written (§2): every metric point
        of a trial's reports (kept in its latest checkpoint, ``FLTrainable.save_checkpoint``)
        that its child run lacks, at the report's round, each once.

        A SIGKILL loses the background writer's queue; the trials' own checkpoints under
        ``tune_dir`` (shared storage) still hold every report up to their last checkpoint, and
        Tune re-runs what came after it. Points already in the store are never written again
        (looked up per metric and round), so running this twice writes nothing the second time.
        Returns ``{"trials": n checked, "points": n written}``.
        """
        import torch
        from mlflow.entities import Metric

        self.flush()
        counts = {"trials": 0, "points": 0}
        root = Path(tune_dir)
        for trial_id, run_id in sorted(self.state.data.get("trials", {}).items()):
            checkpoints = sorted(root.glob(f"*_{trial_id}_*/checkpoint_*/state.pt"))
            if not checkpoints:
                continue
            # checkpoint_NNNNNN: the highest index is the latest
            reports = torch.load(checkpoints[-1], weights_only=False).get("reports") or []
            counts["trials"] += 1
            wanted: dict[str, dict[int, float]] = {}
            for report in reports:
                step = int(report.get("round", 0))
                for key, value in _metrics(report).items():
                    wanted.setdefault(key, {})[step] = value
            now = int(time.time() * 1000)
            missing = []
            for key, by_step in wanted.items():
                have = {m.step for m in self.client.get_metric_history(run_id, key)}
                missing += [Metric(key, v, now, st) for st, v in by_step.items() if st not in have]
            if missing:
                self.writer.log_batch(run_id, metrics=missing)
                counts["points"] += len(missing)
        self.flush()
        return counts

    def reconcile(self) -> dict[str, int]:
        """Make MLflow agree with the Optuna study once the sweep is complete.

        - A trial of this sweep still RUNNING in Optuna (its driver died after asking for it
          and no resumed driver took it over: not expected) is told FAIL, reason ``lost``.
        - Each of this sweep's Optuna trials gets its child run closed as the trial ended, when
          the run says otherwise (a trial that finished after Tune's last save and that Tune
          therefore never reported to this callback again); a trial without any run gets one.
        - A child run still RUNNING that belongs to no Optuna trial (sweeps without a study
          link) is closed KILLED and tagged ``fedsweep.lost_trial`` (kept; exports leave it out).

        Returns the counts: ``closed_trials``, ``synced_runs``, ``created_runs``, ``lost_runs``.
        """
        counts = dict.fromkeys(("closed_trials", "synced_runs", "created_runs", "lost_runs"), 0)
        linked: set[str] = set()
        if self.study is not None:
            counts["closed_trials"] = len(
                self.study.close_running(
                    "lost: the driver was killed after asking for this trial, and no resumed "
                    "driver ran it"
                )
            )
            for told in self.study.trials():
                if not self.study.is_ours(told) or not told.state.is_finished():
                    continue
                run_id = self._child(**{"fedsweep.optuna_trial": str(told.number)})
                run_id = run_id or told.user_attrs.get(ATTR_MLFLOW_RUN)
                if run_id is None:
                    run_id = self._create_run(f"optuna-{told.number}", dict(told.params), told)
                    counts["created_runs"] += 1
                linked.add(run_id)
                self.flush()
                run = self.client.get_run(run_id)
                status, tag = MLFLOW_OF_STATE[told.state.name]
                if run.info.status != status or run.data.tags.get("status") != tag:
                    self._close(
                        run_id,
                        told.state.name,
                        reason=told.user_attrs.get(ATTR_REASON),
                        rounds=told.user_attrs.get(ATTR_ROUNDS),
                        extra={"fedsweep.optuna_trial": told.number},
                    )
                    counts["synced_runs"] += 1
        parent = self.state.parent_run_id
        if parent:
            self.flush()
            running = self.client.search_runs(
                [self.experiment_id],
                filter_string=f"tags.`mlflow.parentRunId` = '{parent}' "
                "and attributes.status = 'RUNNING'",
                max_results=10000,
            )
            for run in running:
                if run.info.run_id in linked:
                    continue
                self._tags(
                    run.info.run_id,
                    {
                        "status": "KILLED",
                        "fedsweep.lost_trial": "true",
                        "failure_reason": "lost: the driver was killed before "
                        "Tune saved this trial; the sweep ran a replacement",
                    },
                )
                self.writer.call(self.client.set_terminated, run.info.run_id, status="KILLED")
                counts["lost_runs"] += 1
        self.flush()
        return counts
