"""DP-FedAvg with client-level DP: McMahan et al., "Learning Differentially Private Recurrent
Language Models", ICLR 2018.

Each sampled client's update is clipped to L2 norm S and the server adds Gaussian noise
sigma*S to the sum (flcore.privacy.client_level). ``privacy.client_sampling`` picks the scheme,
and mechanism and accounting follow it together:

- ``poisson`` (default, the paper's): each client joins a round with probability
  ``q = client_fraction``; the server divides by ``qN`` (the paper's fixed-denominator
  estimator); each round, empty ones included, is ``PoissonSampledDpEvent(q,
  GaussianDpEvent(sigma))`` under add/remove (any of the rdp, prv, pld accountants).
- ``fixed``: ``m = max(1, int(q N))`` clients without replacement, divided by ``m``; each round
  is ``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(sigma / 2))`` under replace-one
  (dp-accounting's RDP accountant only).

The forced full last round (``full_last_round``) is ``q = 1`` (``m = N``): no amplification.
A target epsilon calibrates sigma with the same events. Runs are tagged ``dp_relation`` and
``client_sampling``; epsilons of the two relations are not comparable.

It is :class:`~flcore.algorithms.fedavg.FedAvg` with ``privacy.mechanism: client`` required.
Deviations from the paper: uniform weights (the paper's fixed-denominator estimator with
w_i = 1) rather than capped data-size weights; ``fixed`` sampling is our addition (the paper
analyses Poisson sampling only).
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
    vectorized = True
