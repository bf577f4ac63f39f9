"""A test plugin (loaded through FEDSWEEP_PLUGINS): FedAvg variants that fail on purpose, so the
sweep's trial lifecycle is tested with real trials in real Ray workers, and a driver killer.

- ``fedavg_raises``: raises in every local update (a trial that errors, every attempt).
- ``fedavg_diverges``: its local training returns a NaN loss (a trial that diverges).
- ``fedavg_steady``: plain FedAvg at a fixed learning rate (every trial the same run).
- ``fedavg_lossy``: ``fedavg_steady`` reporting its training loss + 1000, so ASHA ranking on
  ``train_loss`` stops it at its first rung once a steady trial has recorded one.
- ``fedavg_unmeasured``: ``fedavg_steady`` that declares the metric ``fault_metric`` in its
  ``reports`` and never measures it (an objective a trial ends without).

Setting ``FEDSWEEP_FAULT_UNWRITTEN_METRICS=1`` makes the driver's background MLflow writer
never write a metric: what a SIGKILL does to the metrics still in its queue, made certain.

Setting ``FEDSWEEP_FAULT_KILL_AFTER_TELLS=N`` makes the sweep driver SIGKILL itself right after
its N-th tell to Optuna has been stored, before Tune can save its experiment state again (set
``TUNE_GLOBAL_CHECKPOINT_S`` high to keep Tune from saving at any other moment): what a power
cut between the two stores does.
"""

from __future__ import annotations

import math
import os
import signal
from typing import Any

from flcore.algorithms.base import ALGORITHMS
from flcore.algorithms.fedavg import FedAvg
from search_spaces.base import SPACES, param_name

KILL_AFTER_TELLS = "FEDSWEEP_FAULT_KILL_AFTER_TELLS"
UNWRITTEN_METRICS = "FEDSWEEP_FAULT_UNWRITTEN_METRICS"


@ALGORITHMS.register("fedavg_raises")
class FedAvgRaises(FedAvg):
    name = "fedavg_raises"

    def train_local(self, model, data, generator, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("injected failure: fedavg_raises always fails")


@ALGORITHMS.register("fedavg_diverges")
class FedAvgDiverges(FedAvg):
    name = "fedavg_diverges"

    def train_local(self, model, data, generator, **kwargs):  # type: ignore[no-untyped-def]
        super().train_local(model, data, generator, **kwargs)
        return math.nan


@ALGORITHMS.register("fedavg_steady")
class FedAvgSteady(FedAvg):
    name = "fedavg_steady"


@ALGORITHMS.register("fedavg_lossy")
class FedAvgLossy(FedAvg):
    name = "fedavg_lossy"

    def train_local(self, model, data, generator, **kwargs):  # type: ignore[no-untyped-def]
        return super().train_local(model, data, generator, **kwargs) + 1000.0


@ALGORITHMS.register("fedavg_unmeasured")
class FedAvgUnmeasured(FedAvg):
    name = "fedavg_unmeasured"
    reports = FedAvg.reports | {"fault_metric"}


def _space(trial, algorithm):  # type: ignore[no-untyped-def]
    trial.suggest_float(param_name(algorithm, "lr"), 0.01, 0.02)


def _fixed_space(trial, algorithm):  # type: ignore[no-untyped-def]
    trial.suggest_categorical(param_name(algorithm, "lr"), [0.05])


SPACES.register("fedavg_raises")(_space)
SPACES.register("fedavg_diverges")(_space)
for _name in ("fedavg_steady", "fedavg_lossy", "fedavg_unmeasured"):
    SPACES.register(_name)(_fixed_space)


def _kill_after_tells(limit: int) -> None:
    """SIGKILL this process after the ``limit``-th trial completion told to Optuna."""
    from sweeps.search import FedSweepSearch

    tell = FedSweepSearch.on_trial_complete
    told = [0]

    def on_trial_complete(
        self: Any, trial_id: str, result: Any = None, error: bool = False
    ) -> None:
        tell(self, trial_id, result=result, error=error)
        told[0] += 1
        if told[0] >= limit:
            os.kill(os.getpid(), signal.SIGKILL)

    FedSweepSearch.on_trial_complete = on_trial_complete  # type: ignore[method-assign]


if os.environ.get(KILL_AFTER_TELLS):
    _kill_after_tells(int(os.environ[KILL_AFTER_TELLS]))


def _never_write_metrics() -> None:
    """The writer drops every metric it is given (its tags, params and calls go through)."""
    from sweeps.mlflow_writer import BackgroundWriter

    log_batch = BackgroundWriter.log_batch

    def without_metrics(self: Any, run_id: str, metrics=(), params=(), tags=()) -> None:  # type: ignore[no-untyped-def]
        if params or tags:
            log_batch(self, run_id, params=params, tags=tags)

    BackgroundWriter.log_batch = without_metrics  # type: ignore[method-assign]


if os.environ.get(UNWRITTEN_METRICS):
    _never_write_metrics()
