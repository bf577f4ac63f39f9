"""DP-FedAvg in HyperFL's ISRL-DP setting (Guo et al., AAAI 2025, appendix D.1, "Compared
Methods"): McMahan et al.'s DP-FedAvg (ICLR 2018) adapted so that each client protects its own
records against an honest-but-curious server (Lowy & Razaviyayn 2023): local training is DP-SGD
(per-sample clipping to C, Gaussian noise sigma*C, Poisson sampling at q = B / n_i), then FedAvg.

It is :class:`~flcore.algorithms.fedavg.FedAvg` with ``privacy.mechanism: dpsgd`` required, not a
copy. The paper's setting is epsilon = 4, delta = 1e-5 (appendix D.1 writes "the Gaussian noise
sigma is 1e-5 to satisfy the (epsilon, sigma) privacy guarantee", read as delta, as the authors'
code's ``target_delta``); the authors' code clips per sample at
0.04 and calibrates sigma with Opacus for ``rounds x local_epochs`` epochs: 12,000 steps at
q = 1/12 for 200 rounds of 5 epochs over 600 records with B = 50. Set
``privacy: {mechanism: dpsgd, target_epsilon: 4, delta: 1e-5, clip: 0.04}``.

Accounting is per client (flcore.privacy.isrl): a client composes only the rounds it took part
in, without amplification from client sampling; the reported epsilon is the largest over clients.
"""

from __future__ import annotations

from flcore.algorithms.base import ALGORITHMS
from flcore.algorithms.fedavg import FedAvg

__all__ = ["DPFedAvg"]


@ALGORITHMS.register("dp_fedavg")
class DPFedAvg(FedAvg):
    """FedAvg whose clients train with DP-SGD (record-level ISRL-DP)."""

    name = "dp_fedavg"
    privacy_mechanisms = frozenset({"dpsgd"})
    requires_privacy = "dpsgd"
    vectorized = True
