"""What FedHKD's knowledge noise buys: ``epsilon_knowledge`` of R rounds of releases, for the
clipping modes ``l2`` (noise multiplier sigma) and ``coordinate`` (the paper's exact noise:
multiplier sigma / sqrt(d)), against the paper's per-release claim (Sec. 4.3: sigma 7 gives
epsilon 0.5 at delta 0.01 for one release, read per coordinate).

Every figure is the accountant's (flcore.privacy.accounting, Opacus RDP): R Gaussian releases
composed, under "replace one record by another of the same class". It covers the
representation means only, as a function of a fixed model: a FedHKD run's own epsilon is inf
(its model and soft predictions are unprotected). Prints JSON.

    .venv/bin/python benchmarks/fedhkd_epsilon.py
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from flcore.privacy.accounting import compute_epsilon  # noqa: E402


def main() -> None:
    rows = []
    for sigma in (7.0, 20.0):
        for clip, d in (("l2", None), ("coordinate", 32), ("coordinate", 64)):
            mult = sigma if d is None else sigma / math.sqrt(d)
            for delta in (1e-5, 1e-2):
                rows.append(
                    {
                        "sigma": sigma,
                        "knowledge_clip": clip,
                        "latent_dim": d,
                        "accounted_multiplier": round(mult, 4),
                        "delta": delta,
                        "epsilon_1_release": round(compute_epsilon([(mult, 1.0, 1)], delta), 3),
                        "epsilon_50_rounds": round(compute_epsilon([(mult, 1.0, 50)], delta), 3),
                    }
                )
    print(
        json.dumps({"paper_claim": "epsilon 0.5 per release at delta 0.01", "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
