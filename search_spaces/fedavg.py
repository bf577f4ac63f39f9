"""The plain-FL family: FedAvg and Local-only.

Ranges, around HyperFL's Fashion-MNIST setup (Guo et al., AAAI 2025, appendix D.1: SGD lr 0.01,
momentum 0.5, 5 local epochs, full participation of 20 clients):

| key | range | why |
|---|---|---|
| ``lr`` | 1e-3 .. 1e-1, log | one decade either side of the paper's 0.01 |
| ``local_epochs`` | 1 .. 5 | the paper uses 5; fewer trades accuracy for time |
| ``client_fraction`` (FedAvg) | 0.1 .. 1.0 | the paper's 100-client setup samples 0.3 |
| ``optimizer.momentum`` | 0.0 .. 0.9 | the paper's 0.5 in the middle |

Local-only has no sampling knob worth searching (a client left out simply does not train), so
its space omits ``client_fraction``. Neither has a privacy knob: without DP their epsilon is inf
(FedAvg) or 0 (Local-only, which uploads nothing).
"""

from __future__ import annotations

from typing import Any

from search_spaces.base import SPACES, param_name

__all__ = ["fedavg_space", "local_space"]


def _utility(trial: Any, algorithm: str) -> None:
    trial.suggest_float(param_name(algorithm, "lr"), 1e-3, 1e-1, log=True)
    trial.suggest_int(param_name(algorithm, "local_epochs"), 1, 5)
    trial.suggest_float(param_name(algorithm, "optimizer.momentum"), 0.0, 0.9)


@SPACES.register("fedavg")
def fedavg_space(trial: Any, algorithm: str = "fedavg") -> None:
    """FedAvg: learning rate, local epochs, momentum, client sampling rate."""
    _utility(trial, algorithm)
    trial.suggest_float(param_name(algorithm, "client_fraction"), 0.1, 1.0)


@SPACES.register("local")
def local_space(trial: Any, algorithm: str = "local") -> None:
    """Local-only: learning rate, local epochs, momentum."""
    _utility(trial, algorithm)
