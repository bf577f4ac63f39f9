"""How much of a client's meta-gradient its walk neighbours read off one LoDMeta step (issue 26
section 4), without any image attack. flcore alone.

The paper claims that sending fewer auxiliary parameters leaks less: LoDMeta (Algorithm 2) sends
only w, LoDMeta-basic (Algorithm 1) sends w, m and v. What the colluding predecessor and
successor of client i can compute from what they see:

- ``lodmeta_sgd``: ``g^ = (w - w') / eta``, the meta-gradient itself;
- ``lodmeta_basic``: ``g^ = (m' - theta m) / (1 - theta)`` from the token, the meta-gradient
  itself;
- ``lodmeta``: ``r = (w - w') / eta = m' / sqrt(v' + lambda)``. With theta 0 and the client's
  own v still 0 (its first visit, which the attacker can know: the walk's start and every
  client's state are public at step 0) ``r = g / sqrt((1 - beta) g^2 + lambda)``, strictly
  increasing in g, so ``g^ = r sqrt(lambda) / sqrt(1 - (1 - beta) r^2)``; after a visit the
  attacker does not know v and this inversion (v taken as 0) is only a guess.

For each method, a walk on the FMNIST config, and at each of ``--at`` steps the visited client's
true meta-gradient g (its real task, noise-free: ``flcore.algorithms.meta.maml``) against the
attacker's ``g^`` from its real upload: cosine, relative L2 error and the fraction of entries
with the right sign, in float32 as the run computes.

With privacy (``--set privacy.mechanism=perturbation --set privacy.release_epsilon=0.8 ...``,
labelled ``--label``) the upload is the noised, clipped step and ``g^`` is compared with the
clean, unclipped meta-gradient: how much of it the noise leaves to the neighbours.

    .venv/bin/python benchmarks/lodmeta_release.py --steps 1 50 300
    .venv/bin/python benchmarks/lodmeta_release.py --steps 1 2 3 300 --label dp-e0.8-d0.1 \
        --set privacy.mechanism=perturbation --set privacy.release_epsilon=0.8 \
        --set privacy.delta=0.1 --set privacy.clip=0.6
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _machine import machine  # noqa: E402
from _runs import runs_dir  # noqa: E402

from flcore.algorithms.base import ClientData, ClientTask  # noqa: E402
from flcore.algorithms.meta.maml import meta_gradient, tensors  # noqa: E402
from flcore.config import load_config  # noqa: E402
from flcore.executor import client_generator  # noqa: E402
from flcore.experiment import build_data, build_engine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def recovered(method: str, alg: Any, task: ClientTask, upload: dict[str, torch.Tensor]) -> dict:
    """The attacker's g^ (module docstring), keyed by parameter name."""
    p, eta = alg.params, float(alg.training.lr)
    names = [k[2:] for k in task.payload if k.startswith("w.")]
    out = {}
    for n in names:
        w, w2 = task.payload[f"w.{n}"].float(), upload[f"w.{n}"].float()
        if method == "lodmeta_basic":
            out[n] = (upload[f"m.{n}"] - p.theta * task.payload[f"m.{n}"]) / (1 - p.theta)
        elif method == "lodmeta_sgd":
            out[n] = (w - w2) / eta
        else:
            r = (w - w2) / eta
            inside = (1 - (1 - p.beta) * r.pow(2)).clamp(min=1e-30)
            out[n] = r * (p.lam**0.5) / inside.sqrt()
    return out


def compare(g: dict[str, torch.Tensor], h: dict[str, torch.Tensor]) -> dict[str, float]:
    a = torch.cat([g[k].flatten().double() for k in g])
    b = torch.cat([h[k].flatten().double() for k in g])
    cos = float(torch.dot(a, b) / (a.norm() * b.norm() + 1e-30))
    rel = float((a - b).norm() / (a.norm() + 1e-30))
    big = a.abs() > 1e-8
    sign = float((torch.sign(a[big]) == torch.sign(b[big])).double().mean())
    return {"cosine": cos, "relative_error": rel, "sign_agreement": sign, "norm": float(a.norm())}


class ReleaseProbe:
    """An engine probe: before each chosen step, the visited client's true meta-gradient
    against what its walk neighbours recover from the step it is about to take (replayed on a
    fresh instance of the algorithm, so the walk is unchanged)."""

    def __init__(self, method: str, steps: list[int], factory: Any, label: str = "") -> None:
        self.method, self.steps, self.factory, self.label = method, set(steps), factory, label
        self.rows: list[dict[str, Any]] = []

    def before_round(self, engine: Any, round: int, tasks: list[ClientTask]) -> None:
        if round not in self.steps:
            return
        alg, data = engine.algorithm, engine.data
        replayer = self.factory()
        p = alg.params
        for task in tasks:
            cid = task.client_id
            support = tensors(data.client_train(cid), data.info, alg.device)
            query = tensors(data.client_val(cid), data.info, alg.device)
            w = alg.take(task.payload, "w.")
            g, _ = meta_gradient(alg.net(), w, support, query, steps=p.inner_steps,
                                 lr=p.inner_lr, first_order=p.first_order)  # fmt: skip
            cdata = ClientData(cid, data.client_train(cid), data.client_test(cid), data.info,
                               data.client_val(cid))  # fmt: skip
            upload = replayer.local_update(cdata, task, client_generator(engine.seed, round, cid))
            row = {
                "method": self.method,
                "label": self.label,
                "step": round,
                "client": cid,
                "client_visits_before": alg.visits[cid],
                **compare(g, recovered(self.method, alg, task, upload.upload)),
            }
            print(f"[release] {row}", file=sys.stderr, flush=True)
            self.rows.append(row)

    def round_metrics(self, round: int) -> dict[str, Any]:
        return {}

    def summary(self, engine: Any) -> dict[str, Any]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Any) -> None:
        pass


def run(method: str, steps: list[int], args: argparse.Namespace) -> list[dict[str, Any]]:
    over = [
        f"rounds={max(steps)}",
        f"num_clients={args.clients}",
        f"eval_every={10**9}",
        "workers=1",
        f"seed={args.seed}",
        "output_dir=/tmp/fedsweep-lodmeta-release",
        *args.set,
    ]
    cfg = load_config(REPO / f"sweeps/configs/lodmeta/fmnist_{method}.yaml", over)
    engine = build_engine(cfg, data=build_data(cfg))
    probe = ReleaseProbe(method, steps, engine.factory, args.label)
    engine.probes.append(probe)
    engine.run()
    return probe.rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["lodmeta", "lodmeta_basic", "lodmeta_sgd"])
    ap.add_argument("--steps", nargs="+", type=int, default=[1, 50, 300])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="key=value for every run")
    ap.add_argument("--label", default="", help="names the --set variant in the output")
    ap.add_argument("--out", type=Path, default=None, help="default: release[-LABEL].json")
    args = ap.parse_args()
    if args.out is None:
        name = f"release-{args.label}.json" if args.label else "release.json"
        args.out = runs_dir("lodmeta") / name
    rows = [r for m in args.methods for r in run(m, sorted(set(args.steps)), args)]
    doc = {"machine": machine(), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
