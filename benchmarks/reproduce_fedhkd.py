"""Check FedHKD's claims on Fashion-MNIST as trends, in resumable chunks (issue 25 section 4).

The paper (Chen & Vikalo, ICLR 2023) has no FMNIST numbers, so its claims are checked as trends on
FMNIST with the FedHKD CNN (``sweeps/configs/fedhkd/fmnist_<method>.yaml``: 600 records a client
split 75/25, Adam lr 1e-3 halved every 10 rounds, batch 64, 5 local epochs, 50 rounds, every
client every round), in the settings

- ``n10-b0.2``, ``n10-b0.5``, ``n10-b5``: 10 clients at Dirichlet beta 0.2, 0.5, 5;
- ``n20-b0.5``, ``n50-b0.5``: 20 and 50 clients at beta 0.5.

Each run lives in ``OUT/<setting>-<method>[-<label>]-s<seed>/`` (default OUT:
``~/.cache/fedsweep-runs/fedhkd``) and is resumable exactly as benchmarks/reproduce_table1.py's
(``--max-minutes``, ``--checkpoint-every``, ``--until-round``; benchmarks/_runs.py); an ended
run also leaves its record under ``--records`` (default ``benchmarks/records/fedhkd/``, committed),
which ``--summary`` reads beside OUT's folders. ``--set
algorithm_params.sigma=0 --label sigma0`` runs a variant (the noise study: sigma 0, 7, 20).
Needs flcore only (no Ray, MLflow or Optuna): it runs on a GPU machine with PyTorch alone.

The output is one JSON object: per run, local accuracy (``accuracy``: each client's model after
local training on its own test records, the paper's "local accuracy"), global accuracy
(``global_accuracy``: the aggregated model on the whole test set, the paper's "global accuracy"),
bytes uploaded per client and round, ``knowledge_classes_shared`` and ``epsilon_knowledge`` where
the method has them, and the seconds spent. ``--summary`` prints the markdown table of OUT (means
± std over seeds) and which of the paper's claims the runs support: issue 25's five, then
claims 1-3 at Table 1's 20 and 50 clients (6) and Table 1's ranking of FedHKD (7).

    .venv/bin/python benchmarks/reproduce_fedhkd.py --settings n10-b0.5 --seeds 0 1 2
    .venv/bin/python benchmarks/reproduce_fedhkd.py --summary
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine  # noqa: E402
from _runs import (  # noqa: E402
    MIN_SEEDS,
    add_run_options,
    claim_line,
    compare,
    ended_rows,
    epsilon_cell,
    execution_overrides,
    record_file,
    records_dir,
    resume_run,
    run_ended,
    scan_runs,
    seed_cell,
    under_way_note,
)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "sweeps" / "configs" / "fedhkd"
METHODS = (
    "fedavg",
    "fedprox",
    "moon",
    "fedproto",
    "fedmd",
    "fedgen",
    "fedalign",
    "fedhkd_star",
    "fedhkd",
    "fedhkd_dp",
)
#: setting name -> (clients, Dirichlet beta)
SETTINGS: dict[str, tuple[int, float]] = {
    "n10-b0.2": (10, 0.2),
    "n10-b0.5": (10, 0.5),
    "n10-b5": (10, 5.0),
    "n20-b0.5": (20, 0.5),
    "n50-b0.5": (50, 0.5),
}
#: Table 1's settings (beta 0.5; 10, 20 and 50 clients holding 10, 20 and 50% of the data)
TABLE1 = ("n10-b0.5", "n20-b0.5", "n50-b0.5")
#: the methods Table 1 ranks (every method but the DP variant, which the paper does not have)
TABLE1_METHODS = tuple(m for m in METHODS if m != "fedhkd_dp")
KEYS = ("accuracy", "global_accuracy")
#: the paper's rounds (Appendix A.1): only runs that did them count in the claims
ROUNDS = 50
_RUN = re.compile(r"^(?P<setting>n\d+-b[\d.]+)-(?P<name>.+)-s(?P<seed>\d+)$")


def config_path(method: str) -> Path:
    return CONFIGS / f"fmnist_{method}.yaml"


def _pct(value: Any) -> float | None:
    return None if value is None else round(100.0 * float(value), 2)


def run_one(
    method: str, setting: str, seed: int, args: argparse.Namespace, deadline: float
) -> dict[str, Any]:
    """Run (or resume, or only read) one run; returns its JSON record."""
    from flcore.config import load_config

    clients, beta = SETTINGS[setting]
    over = [
        f"seed={seed}",
        f"workers={args.workers}",
        f"num_clients={clients}",
        f"partition.beta={beta}",
        *execution_overrides(args),
    ]
    if args.rounds is not None:
        over.append(f"rounds={args.rounds}")
    cfg = load_config(config_path(method), [*over, *args.set])
    label = f"-{args.label}" if args.label else ""
    run_dir = Path(args.out) / f"{setting}-{method}{label}-s{seed}"
    engine, summary, spent = resume_run(
        cfg,
        run_dir,
        checkpoint_every=args.checkpoint_every,
        deadline=deadline,
        until_round=args.until_round,
        record=record_file(args, run_dir.name),
    )
    done = max(1, engine.round)
    return {
        "run": run_dir.name,
        "method": method,
        "setting": setting,
        "overrides": args.set,
        "seed": seed,
        "rounds": engine.rounds,
        "rounds_done": engine.round,
        "ended": run_ended(engine, summary),
        "diverged_round": summary.get("diverged_round"),
        "accuracy": _pct(summary.get("accuracy")),
        "global_accuracy": _pct(summary.get("global_accuracy")),
        "bytes_up_per_client_round": summary.get("bytes_up", 0.0) / done / cfg.num_clients,
        "knowledge_classes_shared": summary.get("knowledge_classes_shared"),
        "epsilon_knowledge": summary.get("epsilon_knowledge"),
        "epsilon": summary.get("epsilon"),
        "seconds": round(spent, 1),
        # the knowledge inversion's scores when the run carries a knowledge_attack
        **{k: v for k, v in summary.items() if k.startswith("knowledge_") and v is not None},
    }


def read_runs(out: Path, records: Path | None = None) -> list[dict[str, Any]]:
    """Every ended or stopped run folder under ``out`` with a ``summary.json``, and every
    record under ``records`` of a run with no such folder."""
    runs = scan_runs(out, _RUN, METHODS, records, length=ROUNDS)
    return [r for r in runs if r["setting"] in SETTINGS]


def _group(runs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, list[float]]]:
    """(setting, method, label) -> metric -> per-seed values (accuracies in %), in seed order;
    ``rounds`` the rounds each run has done."""
    out: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for r in sorted(runs, key=lambda r: r["seed"]):
        cell = out.setdefault((r["setting"], r["method"], r["label"]), {})
        s = r["summary"]
        for key in ("accuracy", "global_accuracy"):
            if s.get(key) is not None:
                cell.setdefault(key, []).append(100.0 * float(s[key]))
        cell.setdefault("rounds", []).append(float(s.get("rounds", 0)))
        if s.get("epsilon") is not None:  # "inf" in JSON for a run without a guarantee
            cell.setdefault("epsilon", []).append(float(s["epsilon"]))
    return out


def summary_table(runs: list[dict[str, Any]]) -> str:
    """Markdown: one row per (setting, method, label), means ± std over its ended seeds, and
    their epsilon (:func:`epsilon_cell`; at the config's delta); a seed under way is named
    beside them with its figures so far (a row of runs none of which has ended shows them)."""
    groups, paused = ended_rows(runs, _group)
    lines = [
        "| setting | method | seeds | rounds | local accuracy | global accuracy | epsilon |",
        "|---|---|---|---|---|---|---|",
    ]
    order = {m: i for i, m in enumerate(METHODS)}
    settings = list(SETTINGS)
    for (setting, method, label), cell in sorted(
        groups.items(), key=lambda kv: (settings.index(kv[0][0]), order[kv[0][1]], kv[0][2])
    ):
        name = f"{method} ({label})" if label else method
        rounds = ", ".join(str(int(r)) for r in sorted(set(cell["rounds"])))
        under_way = paused[(setting, method, label)]
        seeds = f"{len(cell['rounds'])}" + (f" (+{len(under_way)} under way)" if under_way else "")
        lines.append(
            f"| {setting} | {name} | {seeds} | {rounds} "
            f"| {seed_cell(cell.get('accuracy', []))}{under_way_note(under_way)} "
            f"| {seed_cell(cell.get('global_accuracy', []))} "
            f"| {epsilon_cell(cell.get('epsilon', []))} |"
        )
    return "\n".join(lines)


def claims(runs: list[dict[str, Any]]) -> list[str]:
    """The paper's claims on the runs without a label (and the sigma0 variant for claim
    5), each ``supported``, ``NOT supported``, ``inconclusive`` or ``not measured``
    (:func:`compare`), with the differences of the seed means behind it. Only runs that did
    the paper's :data:`ROUNDS` rounds count (a run paused part-way has a summary too)."""
    ended = [r for r in runs if int(r["summary"].get("rounds", 0)) >= ROUNDS]
    g = _group(ended)

    def v(setting: str, method: str, key: str, label: str = "") -> list[float]:
        return g.get((setting, method, label), {}).get(key, [])

    def over_fedavg(x: str) -> list[tuple[str, str]]:  # claim 1 at setting x: local, global
        return [compare(v(x, "fedhkd", k), v(x, "fedavg", k), ">=") for k in KEYS]

    def local_order(x: str) -> list[tuple[str, str]]:  # claim 2 at setting x
        return [
            compare(v(x, "fedhkd", "accuracy"), v(x, "fedhkd_star", "accuracy"), ">="),
            compare(v(x, "fedhkd_star", "accuracy"), v(x, "fedproto", "accuracy"), "~"),
        ]

    def global_order(x: str) -> list[tuple[str, str]]:  # claim 3 at setting x
        key = "global_accuracy"
        return [compare(v(x, "fedhkd_star", key), v(x, "fedproto", key), ">")]

    s = "n10-b0.5"
    one = over_fedavg("n10-b0.2") + over_fedavg(s)
    two = local_order(s)
    three = global_order(s)

    def gain(x: str, key: str) -> list[float]:
        """Per seed both methods ran, FedHKD's ``key`` accuracy minus FedAvg's."""
        h, f = (
            {
                r["seed"]: 100.0 * float(r["summary"][key])
                for r in ended
                if (r["setting"], r["method"], r["label"]) == (x, m, "")
                and r["summary"].get(key) is not None
            }
            for m in ("fedhkd", "fedavg")
        )
        return [h[seed] - f[seed] for seed in sorted(h.keys() & f.keys())]

    # global first (the paper's headline for this trend), then local
    four = []
    for key in ("global_accuracy", "accuracy"):
        gains = {x: gain(x, key) for x in ("n10-b0.2", "n10-b0.5", "n10-b5")}
        four += [
            compare(gains["n10-b0.2"], gains["n10-b0.5"], ">="),
            compare(gains["n10-b0.5"], gains["n10-b5"], ">="),
        ]
    five = [
        compare(v(s, "fedhkd", key, "sigma0"), v(s, "fedhkd", key), "~")
        for key in ("accuracy", "global_accuracy")
    ]
    # Table 1's other two columns (20 and 50 clients at beta 0.5): claims 1-3 there
    six = [c for x in TABLE1[1:] for c in over_fedavg(x) + local_order(x) + global_order(x)]
    seven = [rank(g, x, k) for x in TABLE1 for k in KEYS]
    return [
        claim_line(1, "FedHKD >= FedAvg, local and global, at beta 0.2 and 0.5", one),
        claim_line(2, f"FedHKD >= FedHKD* ~ FedProto (local) at {s}", two),
        claim_line(3, f"FedHKD* > FedProto (global) at {s}", three),
        claim_line(
            4, "FedHKD's gain over FedAvg shrinks as beta grows (0.2, 0.5, 5; global, local)", four
        ),
        claim_line(
            5, f"sigma 7 costs at most 1 point against sigma 0 at {s} (local, global)", five
        ),
        claim_line(
            6,
            "claims 1-3 at 20 and 50 clients, beta 0.5 (Table 1: FedHKD >= FedAvg local, global;"
            " FedHKD >= FedHKD* ~ FedProto local; FedHKD* > FedProto global)",
            six,
        ),
        claim_line(
            7,
            "FedHKD ranks first or second of the nine methods at 10, 20 and 50 clients, beta 0.5"
            " (Table 1; local, global)",
            seven,
        ),
    ]


def rank(
    g: dict[tuple[str, str, str], dict[str, list[float]]], setting: str, key: str
) -> tuple[str, str]:
    """Whether FedHKD ranks first or second of :data:`TABLE1_METHODS` on ``key`` at ``setting``
    (Table 1's "generally ranks as either the best or the second best"): ``not measured``
    unless every method ran there; ``inconclusive`` while any of the nine has fewer than
    :data:`MIN_SEEDS` seeds (a rank against one seed of a baseline decides nothing); ``NOT
    supported`` where two or more methods are above FedHKD by more than two
    standard errors (:func:`compare`); ``supported`` where at most one method's seed mean is
    above FedHKD's; otherwise ``inconclusive`` (methods ahead, inside the seed noise). Shown:
    FedHKD's rank by seed mean and its difference to the best other method."""
    values = {m: g.get((setting, m, ""), {}).get(key, []) for m in TABLE1_METHODS}
    if any(not v for v in values.values()):
        return "not measured", "-"
    own = values["fedhkd"]
    means = {m: statistics.fmean(v) for m, v in values.items()}
    ahead = [m for m in TABLE1_METHODS if m != "fedhkd" and means[m] > means["fedhkd"]]
    best = max((m for m in TABLE1_METHODS if m != "fedhkd"), key=means.__getitem__)
    fewest, most = min(map(len, values.values())), max(map(len, values.values()))
    seeds = f"{most}" if fewest == most else f"{fewest}-{most}"
    shown = (
        f"rank {len(ahead) + 1}/{len(TABLE1_METHODS)}, {best} {means[best] - means['fedhkd']:+.2f}"
        f" ({seeds} seeds)"
    )
    if fewest < MIN_SEEDS:
        return "inconclusive", shown
    beyond = [m for m in ahead if compare(own, values[m], ">=")[0] == "NOT supported"]
    if len(beyond) >= 2:
        return "NOT supported", shown
    return ("supported" if len(ahead) <= 1 else "inconclusive"), shown


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--settings", nargs="+", default=["n10-b0.5"], choices=list(SETTINGS))
    add_run_options(
        ap,
        "fedhkd",
        rounds_help="rounds (default: the config's 50)",
        summary_help="print the table and the claims",
    )
    args = ap.parse_args(argv)
    if args.set and not args.label:
        ap.error("--set needs --label (the variant's name in the run folders)")
    if args.summary:
        runs = read_runs(Path(args.out), records_dir(args))
        print(summary_table(runs))
        print()
        print("\n".join(claims(runs)))
        return
    missing = [str(config_path(m)) for m in args.methods if not config_path(m).is_file()]
    if missing:
        ap.error(f"no config: {', '.join(missing)}")
    deadline = time.time() + args.max_minutes * 60
    runs = [
        run_one(m, s, seed, args, deadline)
        for s in args.settings
        for m in args.methods
        for seed in args.seeds
    ]
    print(json.dumps({"machine": machine(), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
