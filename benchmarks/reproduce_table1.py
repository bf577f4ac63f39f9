"""Reproduce HyperFL's Table 1 (Fashion-MNIST column) in resumable chunks.

Runs each method's config from sweeps/configs/ (HyperFL's setup: 200 rounds, dominant classes,
600 records per client, 5 local epochs, batch 50) for the 20-client and/or 100-client setting
(client fraction 0.3 with a full last round), and for each requested seed. Every
``--checkpoint-every`` rounds the engine's whole state goes to ``OUT/<method>-<clients>-s<seed>/
checkpoint.pt``; a later invocation with the same OUT resumes each run where it stopped (and
skips finished ones), so a CPU can do it in chunks (``--max-minutes`` stops cleanly after the
next checkpoint past that budget). Each run's per-round metrics go to ``metrics.jsonl`` beside
its checkpoint (``accuracy`` after local training and ``accuracy_before``, the models the
clients start the round with: the authors' code measures both); the round-50 checkpoint is
also kept as ``checkpoint-r50.pt`` (``--keep``) for ``reproduce_table3.py``. The result is one
JSON object on stdout: per run, the rounds done, the last evaluated accuracies, the epsilon
spent, the wall seconds spent so far, and the paper's figure.

    .venv/bin/python benchmarks/reproduce_table1.py --methods fedavg hyperfl --clients 20 \\
        --seeds 0 --max-minutes 50

``--set key=value`` overrides every run's config (``--label`` then names the variant in the run
folders), e.g. the paper's protocol for the personalized DP baselines, whose personal parts
train without noise in the authors' code:

    .venv/bin/python benchmarks/reproduce_table1.py --methods ppsgd centaur \\
        --set algorithm_params.personal_dp=false --label paper-protocol
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine  # noqa: E402
from _runs import execution_overrides, runs_dir, truncate_log  # noqa: E402

from analysis.paper import ACCURACY, FMNIST_20, FMNIST_100  # noqa: E402
from flcore.config import load_config  # noqa: E402
from flcore.experiment import build_data, build_engine  # noqa: E402
from sweeps.cli import jsonable  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def run_one(method: str, clients: int, seed: int, args: argparse.Namespace, deadline: float):  # type: ignore[no-untyped-def]
    over = [f"seed={seed}", f"workers={args.workers}", f"eval_every={args.eval_every}"]
    over += [*execution_overrides(args), *args.set]
    if clients == 100:
        over += ["num_clients=100", "client_fraction=0.3", "full_last_round=true"]
    if method == "pfedhn":  # no config file of its own: FedAvg's setup, another algorithm
        cfg = load_config(REPO / "sweeps/configs/fedavg_fmnist.yaml", ["algorithm=pfedhn", *over])
    else:
        cfg = load_config(REPO / f"sweeps/configs/{method}_fmnist.yaml", over)
    label = f"-{args.label}" if args.label else ""
    run_dir = Path(args.out) / f"{method}{label}-{clients}-s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt, log = run_dir / "checkpoint.pt", run_dir / "metrics.jsonl"
    engine = build_engine(cfg, data=build_data(cfg))
    spent = 0.0
    if ckpt.is_file():
        engine.load_checkpoint(ckpt)
        spent = float(json.loads((run_dir / "spent.json").read_text())["seconds"])
        truncate_log(log, engine.round)
    start = time.perf_counter()
    until = min(engine.rounds, args.until_round or engine.rounds)
    if engine.round < until and time.time() < deadline:
        rounds = engine.iter_rounds()
        for result in rounds:
            with log.open("a") as f:
                row = {"round": result.round, **result.metrics}
                f.write(json.dumps({k: jsonable(v) for k, v in row.items()}) + "\n")
            last = result.round == engine.rounds or result.round == args.until_round
            kept = result.round in args.keep
            if result.round % args.checkpoint_every == 0 or last or kept:
                engine.save_checkpoint(ckpt)
                if kept:  # what reproduce_table3.py attacks (round R+1 from round R)
                    shutil.copyfile(ckpt, run_dir / f"checkpoint-r{result.round}.pt")
                total = spent + time.perf_counter() - start
                (run_dir / "spent.json").write_text(json.dumps({"seconds": total}))
                print(
                    f"{run_dir.name}: round {result.round}/{engine.rounds}, {total:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
                if result.round == args.until_round:  # a partial run, e.g. for the attacks
                    break
                if time.time() > deadline and not last:
                    break
        rounds.close()
    spent += time.perf_counter() - start
    summary = engine.summary()
    paper = ACCURACY[FMNIST_20 if clients == 20 else FMNIST_100].get(method)
    return {
        "method": method,
        "overrides": args.set,
        "clients": clients,
        "seed": seed,
        "rounds_done": engine.round,
        "rounds": engine.rounds,
        "accuracy": summary.get("accuracy"),
        "accuracy_before": summary.get("accuracy_before"),
        "global_accuracy": summary.get("global_accuracy"),
        "epsilon": jsonable(summary.get("epsilon")),
        "paper": paper,
        "seconds": round(spent, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["local", "fedavg", "pfedhn", "hyperfl"])
    ap.add_argument("--clients", nargs="+", type=int, default=[20], choices=[20, 100])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--out", default=str(runs_dir("table1")))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--max-minutes", type=float, default=float("inf"))
    ap.add_argument("--set", action="append", default=[], help="key=value for every run")
    ap.add_argument(
        "--until-round",
        type=int,
        default=None,
        help="stop (with a checkpoint) after this round; the run stays a --rounds run",
    )
    ap.add_argument("--label", default="", help="names the --set variant in run folders")
    ap.add_argument(
        "--device",
        default=None,
        help="where the runs compute (cpu, cuda): not a setting, the run keeps its folder; on "
        "cuda ``executor: auto`` vectorizes where the algorithm allows",
    )
    ap.add_argument(
        "--keep",
        nargs="*",
        type=int,
        default=[50],
        help="also keep these rounds' checkpoints as checkpoint-r<R>.pt (Table 3 attacks 51)",
    )
    args = ap.parse_args()
    deadline = time.time() + args.max_minutes * 60
    runs = [
        run_one(m, c, s, args, deadline)
        for c in args.clients
        for m in args.methods
        for s in args.seeds
    ]
    print(json.dumps({"machine": machine(), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
