"""pFedHN-PC: the personalized-classifier variant of pFedHN (Shamsian et al., ICML 2021,
section 4.2; HyperFL's baseline in Table 3).

The server's hypernetwork generates only the feature extractor; each client keeps its own
classifier head, trains it with the generated extractor, and sends back only the extractor's
delta. Everything else is :mod:`flcore.algorithms.pfedhn`, of which this is a subclass
(its vectorized clients too).
"""

from __future__ import annotations

from flcore.algorithms.base import ALGORITHMS
from flcore.algorithms.pfedhn import PFedHN

__all__ = ["PFedHNPC"]


@ALGORITHMS.register("pfedhn_pc")
class PFedHNPC(PFedHN):
    """pFedHN with a personal classifier head on each client."""

    name = "pfedhn_pc"
    personal_head = True
    vectorized = True  # the same local training, with the client's head in the start point
