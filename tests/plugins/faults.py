"""A test plugin (loaded through FEDSWEEP_PLUGINS): FedAvg variants that fail on purpose, so the
sweep's failure handling is tested with real trials in real Ray workers.

- ``fedavg_raises``: raises in every local update (a trial that errors, every attempt).
- ``fedavg_diverges``: its local training returns a NaN loss (a trial that diverges).
"""

from __future__ import annotations

import math

from flcore.algorithms.base import ALGORITHMS
from flcore.algorithms.fedavg import FedAvg
from search_spaces.base import SPACES, param_name


@ALGORITHMS.register("fedavg_raises")
class FedAvgRaises(FedAvg):
    name = "fedavg_raises"

    def train_local(self, model, data, generator):  # type: ignore[no-untyped-def]
        raise RuntimeError("injected failure: fedavg_raises always fails")


@ALGORITHMS.register("fedavg_diverges")
class FedAvgDiverges(FedAvg):
    name = "fedavg_diverges"

    def train_local(self, model, data, generator):  # type: ignore[no-untyped-def]
        super().train_local(model, data, generator)
        return math.nan


def _space(trial, algorithm):  # type: ignore[no-untyped-def]
    trial.suggest_float(param_name(algorithm, "lr"), 0.01, 0.02)


SPACES.register("fedavg_raises")(_space)
SPACES.register("fedavg_diverges")(_space)
