"""FedRolex: Alam, Liu, Yan and Zhang, "FedRolex: Model-Heterogeneous Federated Learning with
Rolling Sub-Model Extraction", NeurIPS 2022.

Implemented (Sec. 3, Eq. 4 and the aggregation that follows it):

- Rolling sub-model extraction: in round j a client of width p (FedRolex's capacity ratio beta)
  gets, in every hidden layer of K channels, the window of ``floor(p K)`` consecutive channels
  starting at ``j mod K``, wrapping past K - 1 to 0; every tensor reading that layer keeps the
  matching inputs (flcore.algorithms.widths.slicing). Input channels and classes are never cut.
  Every client of a round gets the same start, so the windows of narrower clients are nested in
  the wider ones', and over K rounds every channel is trained as often as every other.
- Aggregation: each entry of the global model is the plain mean over the round's clients whose
  window holds it; an entry no client held keeps its value.
- Local training is plain cross-entropy SGD on the received submodel, without the Scaler,
  static BN and label mask that the authors' code inherits from HeteroFL and turns on by
  default (a deviation from their code, not from their paper, which describes none of them):
  the data here are IID, so the mask would mask nothing, and on this BN-free CNN HeteroFL's
  Scaler diverges (BENCHMARKS.md, session 28).
- A narrow client is trained and scored (``accuracy_before``) on the round's window, not on
  the nested first-p slice: its received submodel changes with the round.

Choices where the paper is silent, and deviations:

- The window start of round r (1-based here) is ``(r - 1) mod K``: the paper's ``j mod K`` with
  rounds counted from j = 0, so round 1 is HeteroFL's nested slice. Each layer rolls with its own
  K. (The authors' code rolls the index vector with ``torch.roll``, which moves the window the
  other way round the ring; the coverage over K rounds is the same.)
- The kept channels are laid out in ascending index order in the submodel, not in window order
  (a consistent permutation: the same network function and training; see slicing.py). Hence a
  full-width client's submodel is the server model itself.
- ``accuracy_before`` is the received submodel on the client's test set, ``accuracy`` the trained
  one. The attack surface is the client's submodel at the broadcast weights.
- Pa3dFL Table 7: lr 0.1; no algorithm parameter. No DP mechanism. Under ``capacity: ideal``
  every window is the whole layer, and FedRolex is FedAvg's computation (from the same start,
  ``tests/unit/algorithms/test_width_slicing.py``).
- The vectorized executor (``executor: vectorized``) trains every client's submodel zero-padded
  into the full-width network, its channels in the submodel's own (ascending) order, on plain
  cross-entropy; equal to the loop within 1e-9 in float64 (``tests/unit/test_vectorized.py``).
"""

from __future__ import annotations

import torch

from flcore.algorithms.base import ALGORITHMS
from flcore.algorithms.widths.slicing import SlicedWidthAlgorithm, rolling_channels

__all__ = ["FedRolex"]


@ALGORITHMS.register("fedrolex")
class FedRolex(SlicedWidthAlgorithm):
    """Rolling windows of channels, averaged over the clients covering each entry."""

    name = "fedrolex"
    vectorized = True  # the submodel padded to full width (SlicedWidthAlgorithm.vector_job)

    def kept_channels(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        return rolling_channels(self.full_channels(), self.client_width(client_id), round)
