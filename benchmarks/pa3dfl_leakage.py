"""Does Pa3dFL's upload leak more than FedAvg's? Pa3dFL's "Privacy" paragraph (section 5) says
it "won't produce more privacy concerns than fedavg since it only transfers model parameters",
and that the server's client embeddings, updated only from parameter deltas, cannot leak local
data. We test the first half the way the project tests every such claim: IG on the uploads, the
calibrated metrics (README "Leakage beyond a guess"). flcore alone (no Ray, MLflow or Optuna).

For each method, its Table 1 config (sweeps/configs/pa3dfl/fmnist_<setting>_<method>.yaml),
``--round`` rounds of training (the last one attacked before it trains: round 1 attacks the
initial model), and the leakage evaluation (flcore.attacks.evaluation, HyperFL's protocol) on
``--images`` records of client 0: each record replayed alone through the method's own local
update from the payload the client gets that round, IG with labels given. Pa3dFL's upload is U
and V (and the generated biases and local head) of the decomposed network, which its attack
surface differentiates through; with ``hn_aggregation: false`` (``--set
algorithm_params.hn_aggregation=false --label no-hn``) the personal tensors are unknowns IG
optimises from their public initial values. In Ideal every client has width 1, so Pa3dFL and
FedAvg attack the same architecture from the same records.

What this does not test: the embeddings' half of the claim (they are the server's own state, a
function of the uploads, so they can leak nothing the uploads do not), and any round but the
ones asked for.

    .venv/bin/python benchmarks/pa3dfl_leakage.py --methods fedavg pa3dfl --iterations 2000

Resumable as benchmarks/lodmeta_leakage.py is (``_runs.run_cases``: a case already in the
output is skipped; IG's state is kept in ``<out>.state/``, and so is the engine's, every 5
rounds of the training before the attack: ``--round 50`` killed at round 47 goes on from 45).
Output: ``~/.cache/fedsweep-runs/pa3dfl/leakage.json`` by default. Each case that ends is also
written into ``--records`` (default ``benchmarks/records/pa3dfl_leakage/leakage.json``, committed,
with the machine and the code it started with; ``--records ''``: nowhere), and a case that file
holds is not run again, on this machine or another.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _runs import RECORDS, attacked_run, run_cases, runs_dir  # noqa: E402

from flcore.config import load_config  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
METHODS = ("fedavg", "fjord", "pa3dfl")


def case_key(method: str, setting: str, round: int, label: str, iterations: int) -> str:
    """A case's name in the output: method, variant label, setting, round, IG budget."""
    tag = f"-{label}" if label else ""
    return f"{method}{tag}-{setting}-r{round}-it{iterations}"


def run_case(method: str, setting: str, args: argparse.Namespace) -> dict[str, Any]:
    attack = {
        "name": "ig",
        "rounds": [args.round],
        "clients": [0],
        "images": args.images,
        "iterations": args.iterations,
        "seed": args.seed,
    }
    over = [
        f"rounds={args.round}",
        f"eval_every={10**9}",
        "early_stopping=null",
        "full_last_round=true",  # the attacked (last) round samples every client, 0 included
        "workers=1",
        f"seed={args.seed}",
        "output_dir=/tmp/fedsweep-pa3dfl-leakage",
        f"attack={json.dumps(attack)}",
        *args.set,
    ]
    cfg = load_config(REPO / f"sweeps/configs/pa3dfl/fmnist_{setting}_{method}.yaml", over)
    engine, leakage = attacked_run(cfg, args.out.with_suffix(".state"))
    return {
        "method": method,
        "setting": setting,
        "attacked_round": args.round,
        "client": 0,
        "client_width": engine.algorithm.client_width(0),
        "iterations": args.iterations,
        **leakage,
    }


def _case(method: str, setting: str, args: argparse.Namespace) -> Callable[[], dict[str, Any]]:
    return lambda: run_case(method, setting, args) | {"overrides": args.set}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["fedavg", "pa3dfl"], choices=METHODS)
    ap.add_argument("--settings", nargs="+", default=["ideal"], choices=["ideal", "hetero"])
    ap.add_argument("--round", type=int, default=1, help="the attacked round (1: the start)")
    ap.add_argument("--images", type=int, default=10)
    ap.add_argument("--iterations", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="key=value for every run")
    ap.add_argument("--label", default="", help="names the --set variant in the output")
    ap.add_argument("--out", type=Path, default=runs_dir("pa3dfl") / "leakage.json")
    ap.add_argument(
        "--records",
        default=str(RECORDS / "pa3dfl_leakage" / "leakage.json"),
        help="the committed record of ended cases ('': none)",
    )
    args = ap.parse_args()
    if args.round < 1 or args.images < 1 or args.iterations < 1:
        ap.error("--round, --images and --iterations must be at least 1")
    if args.set and not args.label:
        ap.error("--set needs --label (a variant's cases must not take the plain names)")
    cases = (
        (
            case_key(method, setting, args.round, args.label, args.iterations),
            _case(method, setting, args),
        )
        for setting in args.settings
        for method in args.methods
    )
    done = run_cases(args.out, cases, Path(args.records) if args.records else None)
    print(json.dumps(done, indent=1))


if __name__ == "__main__":
    main()
