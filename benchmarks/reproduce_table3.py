"""Reproduce HyperFL's Table 3 (IG against each method) on Fashion-MNIST, and its tailored
attack, with the paper's IG settings (appendix D.1). The paper gives no round and no client, and
scores 50 images at batch 1: the round (51), the client (0) and the 10 records are ours.

For each method and each attacked round R (``--attack-rounds``, default ``--round`` + 1, round
51; round numbers or ``first``, ``middle``, ``last``, resolved against the
method's config's ``rounds``), the 20-client Table 1 run of ``benchmarks/reproduce_table1.py``
is restored from its round-(R-1) checkpoint (``OUT1/<run>/checkpoint-r<R-1>.pt``, or its
``checkpoint.pt`` when that one is at round R-1; round 1 starts from the initial model), and the
privacy evaluation attacks round R: ``--images`` training records of client ``--client``, each
replayed alone (batch 1, one local step) through the method's own local update, then inverted
with IG (10,000 Adam iterations at lr 0.1 decayed x0.1 at 3/8, 5/8, 7/8, TV 1e-6, signed, boxed;
the labels given, as the paper assumes) and, for HyperFL, with the tailored attack too. Scores
are per record on de-normalised images, then averaged: PSNR, SSIM and LPIPS (null here: no
AlexNet weights offline), and the calibrated ones (``leak_psnr_gain``, ``leak_identified``,
``leak_informative`` and their ``*_informative`` forms: flcore.attacks.evaluation).

A method is an algorithm (its plain run) or a variant named in ``RUNS`` (the DP baselines' paper
protocol; HyperFL with ``head_init_scale: 0.1`` or the authors' 1). Each attack's result on
round R is written to ``OUT3/<attack>-<method>-r<R>.json`` with its image grid beside it
(``.png``); an existing result is reused, so the script can run in pieces (results saved
before the calibrated metrics, ``<attack>-<method>.json``, are not), and an attack killed
midway resumes from its saved optimisation state (``<attack>-<method>-r<R>.state/``, removed
once the result is written). The whole table prints as one JSON
object: ``results`` (one row per attack, method and round) and ``worst_rounds`` (per attack and
method, the worst attacked round's ``leak_psnr_gain``, ``leak_identified`` and ``leak_lpips``).

    .venv/bin/python benchmarks/reproduce_table3.py --methods fedavg pfedhn dp_fedavg hyperfl
    .venv/bin/python benchmarks/reproduce_table3.py --attack-rounds first middle last
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine  # noqa: E402
from _runs import runs_dir  # noqa: E402

from analysis.paper import ATTACK  # noqa: E402
from flcore.algorithms import ALGORITHMS, ClientTask  # noqa: E402
from flcore.attacks.evaluation import identified_p, informative_scores  # noqa: E402
from flcore.attacks.signal import rounding_floor  # noqa: E402
from flcore.config import SYMBOLIC_ROUNDS, load_config, resolve_round  # noqa: E402
from flcore.experiment import build_data, build_engine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: the Table 1 runs whose checkpoints are attacked, by the name ``--methods`` takes: (algorithm,
#: run folder, config overrides). A method not listed is its algorithm's plain run
#: (``<method>-20-s0``); a variant is a ``reproduce_table1.py --label`` run.
RUNS = {
    "ppsgd": ("ppsgd", "ppsgd-paper-protocol-20-s0", ["algorithm_params.personal_dp=false"]),
    "centaur": ("centaur", "centaur-paper-protocol-20-s0", ["algorithm_params.personal_dp=false"]),
    "hyperfl-head-init-0.1": (
        "hyperfl",
        "hyperfl-head-init-0.1-20-s0",
        ["algorithm_params.head_init_scale=0.1"],
    ),
    "hyperfl-head-init-1": (  # the authors' initialisation (the default before session 7)
        "hyperfl",
        "hyperfl-head-init-1-20-s0",
        ["algorithm_params.head_init_scale=1"],
    ),
}


def _run(method: str) -> tuple[str, str, list[str]]:
    """(algorithm, run folder, overrides) of a ``--methods`` name."""
    return RUNS.get(method, (method, f"{method}-20-s0", []))


#: decoys per record of ``leak_identified`` (AttackSettings' default, which these runs use)
IDENTIFY_K = 20

#: what a re-check keeps of a saved record (the attack's own scores)
KEPT = (
    "psnr",
    "ssim",
    "embedding_cosine",
    "psnr_baseline",
    "ssim_baseline",
    "identified",
)


def _config(algorithm: str, extra: list[str], device: str | None = None):  # type: ignore[no-untyped-def]
    """The Table 1 run's config (``device``: where to compute; not a setting)."""
    over = ["seed=0", "workers=1", *extra, *([f"device={device}"] if device else [])]
    if algorithm == "pfedhn":
        return load_config(REPO / "sweeps/configs/fedavg_fmnist.yaml", ["algorithm=pfedhn", *over])
    return load_config(REPO / f"sweeps/configs/{algorithm}_fmnist.yaml", over)


def _checkpoint(run_dir: Path, round: int) -> Path | None:
    if round == 0:
        return None  # round 1 is attacked from the initial model
    kept = run_dir / f"checkpoint-r{round}.pt"
    if kept.is_file():
        return kept
    latest = run_dir / "checkpoint.pt"
    if latest.is_file() and torch.load(latest, weights_only=False)["round"] == round:
        return latest
    return None


def _gradient_check(engine, evaluator, task) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    """Per attacked record: its PSNR and, where the client's private state is the surface's
    unknowns (every algorithm but HyperFL, whose head moves in step 1 before the uploaded step),
    how much gradient the upload carried: the norm of the true gradient of the record at the
    client's starting point and the cosine between it and the gradient the upload implies
    (1 when the upload is one exact step; about 0 when the gradient drowned in float32 rounding
    of the weights, or in DP noise). For every algorithm, HyperFL included: the norm of the
    gradient the upload implies and the norm float32 rounding alone would give it
    (``rounding_floor``), and the tailored attack's embedding cosine."""
    from flcore.data import normalize

    uploads = evaluator.replay(engine, task.round, task)
    observations, truths = [u.observation for u in uploads], [u.records for u in uploads]
    carried = [u.informative for u in uploads]
    rows = []
    state = task.state if isinstance(task.state, dict) else {}
    scores = evaluator.records or [None] * len(observations)
    for obs, rec, score, informative in zip(observations, truths, scores, carried, strict=True):
        row = {"label": int(rec.labels[0]), "informative": informative}
        if score is not None:
            row |= {"psnr": round(score.psnr, 2), "ssim": round(score.ssim, 4)}
            if score.embedding_cos is not None:
                row["embedding_cosine"] = round(score.embedding_cos, 4)
            if score.psnr_base is not None:
                row |= {
                    "psnr_baseline": round(score.psnr_base, 2),
                    "ssim_baseline": round(score.ssim_base, 4),
                    "identified": score.identified,
                }
        surface = obs.surface
        target = obs.target()
        row["upload_grad_norm"] = sum(float(t.pow(2).sum()) for t in target.values()) ** 0.5
        row["rounding_floor"] = rounding_floor(
            surface.start, float(obs.training.lr) * obs.local_steps
        )
        if all(k in state for k in surface.unknowns) and not hasattr(surface, "hnet"):
            unknowns = {k: state[k] for k in surface.unknowns}
            x = normalize(rec.images, obs.info)
            true = surface.gradient(unknowns, x, rec.labels)
            dot = sum(float((true[k] * target[k]).sum()) for k in true)
            tn = sum(float(true[k].pow(2).sum()) for k in true) ** 0.5
            pn = row["upload_grad_norm"]
            row |= {"true_grad_norm": tn, "cosine": dot / (tn * pn + 1e-30)}
        rows.append(row)
    return rows


def _restored(  # type: ignore[no-untyped-def]
    algorithm: str,
    extra: list[str],
    spec: dict,  # type: ignore[type-arg]
    ckpt: Path | str | None,
    device: str | None = None,
):
    """The run restored from ``ckpt`` (None: the initial model) with the evaluation ``spec``,
    and what the engine hands the attacked client at the start of the attacked round (that
    round itself need not train)."""
    cfg = _config(algorithm, extra + [f"attack={json.dumps(spec)}"], device)
    engine = build_engine(cfg, data=build_data(cfg))
    if ckpt is not None:
        engine.load_checkpoint(ckpt)
    alg, cid, r = engine.algorithm, spec["clients"][0], spec["rounds"][0]
    alg.begin_round(r, [cid])
    return engine, ClientTask(cid, r, alg.broadcast(r, cid), engine.client_states[cid], False, 0)


def _recheck(method: str, cached: dict, args: argparse.Namespace) -> list[dict]:  # type: ignore[type-arg]
    """The per-record gradient check of an attack result saved without it (no new attack:
    the same records are replayed; their PSNRs are not known here, only the mean)."""
    algorithm, _, extra = _run(method)
    spec = {
        "name": cached["attack"],
        "rounds": [cached["round"]],
        "clients": [cached["client"]],
        "images": cached["leak_images"],
        "iterations": 1,
        "labels": "given",
    }
    engine, task = _restored(algorithm, extra, spec, cached["checkpoint"], args.device)
    rows = _gradient_check(engine, engine.probes[0], task)
    return [{k: v for k, v in row.items() if k != "psnr"} for row in rows]


def attack_one(method: str, attack: str, attacked: int, args: argparse.Namespace) -> dict:  # type: ignore[type-arg]
    out = Path(args.out) / f"{attack}-{method}-r{attacked}.json"
    if out.is_file():
        cached = json.loads(out.read_text())
        if args.check_cached:  # (re)do the per-record check, keeping the attack's scores
            old = cached.get("records") or [{}] * cached["leak_images"]
            cached["records"] = [
                {k: v for k, v in o.items() if k in KEPT} | new
                for o, new in zip(old, _recheck(method, cached, args), strict=True)
            ]
            # the re-decided records' informative scores (from the saved per-record scores)
            cached |= informative_scores(cached["records"], IDENTIFY_K)
            out.write_text(json.dumps(cached, indent=1))
        if "leak_identified_p" not in cached and cached.get("records"):
            cached["leak_identified_p"] = identified_p(cached["records"], IDENTIFY_K)
        return cached
    algorithm, run, extra = _run(method)
    ckpt = _checkpoint(Path(args.table1) / run, attacked - 1)
    if ckpt is None and attacked > 1:
        return {
            "method": method,
            "attack": attack,
            "round": attacked,
            "missing": f"no round-{attacked - 1} checkpoint of {run}",
        }
    spec = {
        "name": attack,
        "rounds": [attacked],
        "clients": [args.client],
        "images": args.images,
        "iterations": args.iterations,
        "labels": "given",
    }
    engine, task = _restored(algorithm, extra, spec, ckpt, args.device)
    evaluator = engine.probes[0]
    # IG's optimisation state, saved as it goes: a run killed mid-attack resumes there
    state_dir = out.with_suffix(".state")
    evaluator.attack.resume_dir = state_dir
    start = time.perf_counter()
    evaluator.before_round(engine, attacked, [task])
    summary = evaluator.summary(engine)
    per_record = _gradient_check(engine, evaluator, task)
    grid = evaluator.grid_tensors()
    if grid is not None:
        from analysis.plots import plot_attack_grid
        from flcore.attacks.metrics import psnr

        caps = [f"{v:.1f} dB" for v in psnr(grid[1], grid[0]).tolist()]
        plot_attack_grid(
            grid[0].numpy(),
            grid[1].numpy(),
            out.with_suffix(".png"),
            title=f"{attack} on {method} (FMNIST, round {attacked}): originals, reconstructions",
            captions=caps,
        )
    # the paper has no FMNIST attack figures: EMNIST's, the closest (grey 28x28), beside ours
    paper = ATTACK["emnist"].get(algorithm) if attack == "ig" else None
    result = {
        "method": method,
        "attack": attack,
        "round": attacked,
        "client": args.client,
        "checkpoint": None if ckpt is None else str(ckpt),
        **{k: v for k, v in summary.items() if k.startswith("leak")},
        "wall_seconds": round(time.perf_counter() - start, 1),
        "records": per_record,
        "paper_emnist": dict(zip(("psnr", "ssim", "lpips"), paper, strict=True)) if paper else None,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    shutil.rmtree(state_dir, ignore_errors=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--methods",
        nargs="+",
        default=["fedavg", "pfedhn", "dp_fedavg", "ppsgd", "centaur", "hyperfl"],
    )
    ap.add_argument("--tailored", action="store_true", help="also the tailored attack on hyperfl")
    ap.add_argument("--table1", default=str(runs_dir("table1")))
    ap.add_argument("--out", default=str(runs_dir("table3")))
    ap.add_argument("--round", type=int, default=50, help="checkpointed round; R+1 is attacked")
    ap.add_argument(
        "--attack-rounds",
        nargs="+",
        default=None,
        help="attacked rounds: numbers or first, middle, last (resolved against each method's "
        "rounds); default: --round + 1",
    )
    ap.add_argument(
        "--device", default=None, help="where the attacks compute (cpu, cuda): not a setting"
    )
    ap.add_argument("--client", type=int, default=0)
    ap.add_argument("--images", type=int, default=10)
    ap.add_argument("--iterations", type=int, default=10_000)
    ap.add_argument(
        "--check-cached",
        action="store_true",
        help="add the per-record gradient check to saved results that lack it",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    unknown = [m for m in args.methods if _run(m)[0] not in ALGORITHMS.names()]
    if unknown:
        ap.error(f"unknown methods {unknown}; an algorithm or one of {sorted(RUNS)}")
    jobs = []
    for m in args.methods:  # on HyperFL the tailored attack first: the cheap one (IG: ~1 h)
        if args.tailored and _run(m)[0] == "hyperfl":
            jobs.append((m, "hyperfl_tailored"))
        jobs.append((m, "ig"))
    entries = args.attack_rounds or [str(args.round + 1)]
    bad = [e for e in entries if not e.isdigit() and e not in SYMBOLIC_ROUNDS]
    if bad or any(e.isdigit() and int(e) < 1 for e in entries):
        ap.error(f"--attack-rounds: {bad or entries} (numbers >= 1 or first, middle, last)")
    rows = []
    for m, a in jobs:
        total = _config(_run(m)[0], _run(m)[2]).rounds
        rounds = sorted({resolve_round(int(e) if e.isdigit() else e, total) for e in entries})
        rows += [attack_one(m, a, r, args) for r in rounds]
    print(
        json.dumps({"machine": machine(), "results": rows, "worst_rounds": _worst(rows)}, indent=1)
    )


def _worst(rows: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    """Per (attack, method): the worst attacked round's calibrated leakage (the max of each
    round's ``leak_psnr_gain`` and ``leak_identified``, the min of its ``leak_lpips``), as
    flcore.attacks.evaluation's ``*_worst_round`` metrics define it."""
    out = []
    for key in dict.fromkeys((r["attack"], r["method"]) for r in rows):
        done = [r for r in rows if (r["attack"], r["method"]) == key and "missing" not in r]

        def pick(metric: str, best, done=done):  # type: ignore[no-untyped-def]
            values = [r[metric] for r in done if r.get(metric) is not None]
            return best(values) if values else None

        out.append(
            {
                "attack": key[0],
                "method": key[1],
                "rounds": [r["round"] for r in done],
                "leak_psnr_gain_worst_round": pick("leak_psnr_gain", max),
                "leak_identified_worst_round": pick("leak_identified", max),
                "leak_lpips_worst_round": pick("leak_lpips", min),
            }
        )
    return out


if __name__ == "__main__":
    main()
