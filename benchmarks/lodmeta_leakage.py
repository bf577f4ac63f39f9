"""What a LoDMeta client's step leaks to its walk neighbours (issue 26 section 4): the paper
claims that sending fewer auxiliary parameters leaks less (LoDMeta sends w; LoDMeta-basic sends
w, m and v). flcore alone (no Ray, MLflow or Optuna).

For each method, a walk of ``--steps`` steps on the FMNIST config (sweeps/configs/lodmeta/), and
the leakage evaluation (flcore.attacks.evaluation: IG, the calibrated metrics) on the client the
walk reaches at step 1 (its first visit: LoDMeta's private m and v are still 0, which the
attacker knows) and at the last step (for LoDMeta, usually a later visit: m and v are unknowns
the attack optimises). Each attacked upload is the client's step replayed on one of its records
(support and query alike: ``MetaAlgorithm.replay_data``), attacked with labels given.

``--methods fedmaml fedalt`` attack the server-based baselines the same way, the attacker being
the server: it sees each drawn client's meta-gradient (FedMAML) or new shared part (FedAlt,
whose head is an unknown after the client's first round), for every client drawn in the
attacked round (4 by default; ``--set algorithm_params.clients_per_round=1 --label 1client``,
one a round: the paper's "MAML (1 client)").

A caveat measured in session 35 (BENCHMARKS.md): five inner steps fit one record, so a
one-record replay's meta-gradient is small (norm ~1e-3 second order, ~1e-4 first order, against
~0.6 for a real task), and its step read off float32 weights is partly rounding (36% of the
entries exactly 0 second order): the figures are what IG gets from such a release, not from a
client's real step.

``--known rest`` attacks the client's real step instead (its whole 5-way 5-shot task), the
attacker knowing every record of it but the attacked one: differential privacy's adversary
(``attack.known``, flcore.attacks.evaluation). Each record is then its own IG problem on the
whole task's meta-gradient: far slower per iteration than the one-record replay.

    .venv/bin/python benchmarks/lodmeta_leakage.py --steps 300 --images 2 --iterations 1000
    .venv/bin/python benchmarks/lodmeta_leakage.py --known rest --at first --images 1 \
        --iterations 1000 --out ~/.cache/fedsweep-runs/lodmeta/leakage-rest.json

Cases already in the output file are skipped (a resumable chunk); the JSON is rewritten after
each case, and IG's optimisation state is saved beside it as it goes (``<out>.state/``, with
the rounds before the attack checkpointed every 5), so a case killed in training or mid-attack
resumes where it was. Output: ``~/.cache/fedsweep-runs/lodmeta/
leakage.json`` by default.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _runs import attacked_run, run_cases, runs_dir  # noqa: E402

from flcore.config import load_config  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def run_case(method: str, at: str, args: argparse.Namespace) -> dict[str, Any]:
    rounds = 1 if at == "first" else args.steps
    attack = {
        "name": "ig",
        "rounds": [rounds],
        "clients": list(range(args.clients)),  # whoever the walk reaches
        "images": args.images,
        "iterations": args.iterations,
        "seed": args.seed,
        "known": args.known,
    }
    over = [
        f"rounds={rounds}",
        f"num_clients={args.clients}",
        f"eval_every={10**9}",
        "workers=1",
        f"seed={args.seed}",
        "output_dir=/tmp/fedsweep-lodmeta-leakage",
        f"attack={json.dumps(attack)}",
        *args.set,
    ]
    cfg = load_config(REPO / f"sweeps/configs/lodmeta/fmnist_{method}.yaml", over)
    engine, leakage = attacked_run(cfg, args.out.with_suffix(".state"))
    alg = engine.algorithm
    visited = getattr(alg, "position", None)  # a walk's; a server's round draws several
    return {
        "method": method,
        "attacked_step": rounds,
        "client": visited,
        "client_visits_before": None if visited is None else alg.visits[visited] - 1,
        "known": args.known,
        **leakage,
    }


def _case(method: str, at: str, args: argparse.Namespace) -> Callable[[], dict[str, Any]]:
    return lambda: run_case(method, at, args) | {"overrides": args.set}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--methods",
        nargs="+",
        default=["lodmeta", "lodmeta_basic", "lodmeta_sgd"],
        choices=["lodmeta", "lodmeta_basic", "lodmeta_sgd", "fedmaml", "fedalt"],
    )
    ap.add_argument("--at", nargs="+", default=["first", "last"], choices=["first", "last"])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--images", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--known",
        choices=["none", "rest"],
        default="none",
        help="none: replay the step on the attacked record alone; rest: the real step, every "
        "other record of it known to the attacker",
    )
    ap.add_argument("--set", action="append", default=[], help="key=value for every run")
    ap.add_argument("--label", default="", help="names the --set variant in the output")
    ap.add_argument("--out", type=Path, default=runs_dir("lodmeta") / "leakage.json")
    args = ap.parse_args()
    rest = "-rest" if args.known == "rest" else ""
    tag = f"-{args.label}" if args.label else ""
    cases = (
        (f"{method}{tag}{rest}-{at}", _case(method, at, args))
        for method in args.methods
        for at in args.at
    )
    done = run_cases(args.out, cases)
    print(json.dumps(done, indent=1))


if __name__ == "__main__":
    main()
