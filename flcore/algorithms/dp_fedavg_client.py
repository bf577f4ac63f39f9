"""DP-FedAvg with client-level DP: McMahan et al., "Learning Differentially Private Recurrent
Language Models", ICLR 2018.

Each sampled client's update is clipped to L2 norm S and the server adds Gaussian noise
sigma*S to the sum, dividing by the number of sampled clients (flcore.privacy.client_level).
Accounting composes one release per round at sampling rate clients-per-round / total clients
(q = 1 at full participation and in the forced full last round: no amplification).

It is :class:`~flcore.algorithms.fedavg.FedAvg` with ``privacy.mechanism: client`` required.
Deviation from the paper: uniform weights (the paper's fixed-denominator estimator with w_i = 1)
rather than capped data-size weights.
"""

from __future__ import annotations

from flcore.algorithms.base import ALGORITHMS
from flcore.algorithms.fedavg import FedAvg

__all__ = ["DPFedAvgClient"]


@ALGORITHMS.register("dp_fedavg_client")
class DPFedAvgClient(FedAvg):
    """FedAvg with clipped client updates and server-side Gaussian noise."""

    name = "dp_fedavg_client"
    privacy_mechanisms = frozenset({"client"})
    requires_privacy = "client"
