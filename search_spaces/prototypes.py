"""The prototype family: FedProto, as FedHKD's comparison runs it.

FedHKD (Chen & Vikalo, ICLR 2023, Sec. 5 and Appendix A.2) trains every method with Adam at
lr 1e-3 (halved every 10 rounds), batch 64, 5 local epochs, and sets FedProto's lambda to 0.05.
The space searches around those values; the optimizer (Adam) and the lr schedule are the
protocol's, so they are not searched.

| key | range | why |
|---|---|---|
| ``lr`` | 1e-4 .. 1e-2, log | one decade either side of the protocol's Adam lr 1e-3 |
| ``local_epochs`` | 1 .. 5 | the protocol uses 5; fewer trades accuracy for time |
| ``algorithm_params.lam`` | 0.005 .. 0.5, log | one decade either side of FedHKD's 0.05 |
| ``algorithm_params.aggregation`` | count, mean | count-weighted (FedHKD Eq. 9) or plain mean |
"""

from __future__ import annotations

from typing import Any

from search_spaces.base import SPACES, param_name

__all__ = ["fedproto_space"]


@SPACES.register("fedproto")
def fedproto_space(trial: Any, algorithm: str = "fedproto") -> None:
    """FedProto: learning rate, local epochs, the prototype weight and its aggregation."""
    trial.suggest_float(param_name(algorithm, "lr"), 1e-4, 1e-2, log=True)
    trial.suggest_int(param_name(algorithm, "local_epochs"), 1, 5)
    trial.suggest_float(param_name(algorithm, "algorithm_params.lam"), 0.005, 0.5, log=True)
    trial.suggest_categorical(
        param_name(algorithm, "algorithm_params.aggregation"), ["count", "mean"]
    )
