"""LoDMeta and its random-walk baselines: Yang & Kwok, "Communication-Efficient and
Privacy-Preserving Decentralized Meta-Learning" (Algorithms 1 and 2, Table 1, Theorem 4.5).

A meta-model w walks the communication graph (flcore.algorithms.meta.graph): each round (a
"step", ``rounds`` counts them) the walk reaches one client i_t, which computes the MAML
meta-gradient at w on its task (K SGD steps at alpha on its support set, the query loss's
gradient; flcore.algorithms.meta.maml), updates w and passes it to the next client, drawn from
row i_t of the walk's transition matrix P.

- ``lodmeta`` (Algorithm 2): the Adam-style state (m^i, v^i) is the client's own, kept between
  its visits; only w is transmitted (1 unit a step, Table 1).
- ``lodmeta_basic`` (Algorithm 1): one (m, v) travels with w (3 units a step).
- ``lodmeta_sgd`` (the paper's LoDMeta(SGD)): ``w <- w - eta g`` (1 unit a step).

The update (both Adam variants; the paper's, without Adam's bias correction):
``m = theta m + (1 - theta) g``, ``v = beta v + (1 - beta) g^2``,
``w <- w - eta m / sqrt(v + lambda)``; ``eta`` is the config's ``lr`` (paper: 1e-3), theta 0 and
beta 0.99 (Appendix C, "following MAML").

The meta-gradient is second-order MAML, as Sec. 4.1 writes it (``G_i(w) = prod_k (I - alpha
nabla^2 l(u_k(w); support)) nabla l(u_K(w); query)``, Algorithm 2 line 9); ``first_order: true``
is a deviation, offered for cost.

Choices where the paper is silent or leaves to MAML, stated: alpha (``inner_lr``) 0.1 on FMNIST's
CONV4 (the configs). Appendix C says its settings "follow MAML" without giving alpha, and MAML's
is 0.01 on mini-ImageNet (0.4 on Omniglot): 0.1 is ours, for FMNIST. lambda 1e-8 (inside the
square root, as printed); the walk starts at a uniformly drawn client.

The protocol's noise: Appendix C sets "unless otherwise specified" epsilon 0.5 and delta 0.3 for
the privacy perturbation, so the paper's Figures 1-4 are noised runs. Our configs run without
noise (no ``privacy`` mapping): at delta 0.3 a client's 100 records could be released outright
(a ``weak-delta`` run, epsilon inf, below), and on FMNIST no cell of the paper's (epsilon,
delta) grid learns anything (BENCHMARKS.md, LoDMeta, Tables 2-3 grid), so Section 5's accuracy
and communication claims are compared on noise-free runs and the noise is measured apart.

Privacy (``privacy: {mechanism: perturbation, ...}``; flcore.privacy.perturbation):

- The paper's M_meta is the meta-gradient's smoothness constant (Prop. 4.2), not a bound on it,
  and no value is given. Here the meta-gradient is clipped to L2 norm M (``privacy.clip``), so
  replacing the client's whole task moves it by at most 2M: a deviation, stated. The default M,
  ``flcore.config.PERTURBATION_CLIP`` = 0.6, is the median of measured meta-gradient norms over
  the first 100 steps of the FMNIST default (0.627; benchmarks/lodmeta_grad_norms.py).
- **Algorithm 2 as printed is not DP**: its line 13 divides the noised m by sqrt(v + lambda),
  and v (line 11) is built from the clean gradient, so the released w depends on the data
  beyond the noise. Here the clipped gradient is noised once (std ``2 z M``, z the noise
  multiplier) and that noisy gradient feeds both m and v: everything a client releases is
  post-processing of its noisy gradients. ``paper_exact: true`` runs the printed Algorithm 2
  (clean m and v, noise added to m in line 13, no clipping) and is tagged
  ``dp_guarantee: none``.
- Algorithm 1 and LoDMeta(SGD) have no noise in the paper; with a privacy mapping they get the
  same clipped, noised gradient at the same epsilon and delta, for a like-for-like comparison.
- ``epsilon``: each client's releases (one a visit) composed by its own accountant (Gaussian at
  multiplier z, q = 1), the worst client's figure, under replace-one of a client's task
  (``dp_relation: replace-one``; ``dp_guarantee: client-ldp``, local DP of each client's
  data against everyone who sees its transmissions). ``epsilon_paper``: Theorem 4.5's
  network-DP epsilon' at delta + delta_hat, delta_hat = delta, for the per-release epsilon the
  noise corresponds to (the classic formula, defined for epsilon < 1 and delta < 1/2), against
  another client as observer: network DP (Cyffers & Bellet), neighbouring datasets differing
  in one client's task (replace-one, as ``epsilon``), the observer seeing only what reaches it
  rather than every release. It is reported, never used as the guarantee. Its N_u = T/n +
  sqrt(3 T ln(1/delta_hat)/n) bounds a client's visits only where the walk visits clients
  uniformly (a regular graph, or ``graph.walk: metropolis``); on a simple walk over an
  irregular graph (Watts-Strogatz) visits follow degree and the formula, applied as the paper
  states it ("any topology"), can undercount the busiest client. It is computed for every
  variant at the per-release epsilon of its noise where the theorem is defined (that epsilon
  below 1, delta below 1/2; the theorem covers Algorithm 2 only), and
  under ``paper_exact`` too: it is the paper's claim for the printed algorithm, which is not
  DP (``epsilon`` and ``epsilon_accountant`` are inf there). The theorem's premises are not
  checked: it asks ``eta <= 2 / M_meta`` (M_meta unknown) and its proof (Appendix E.3)
  amplifies by iteration, which needs noise of fixed scale in parameter space and contracting
  steps, where the Adam-style update rescales each coordinate's noise by a data-dependent
  ``1 / sqrt(v + lambda)``: ``epsilon_paper`` is the paper's formula, not a bound we vouch for.
  ``paper_exact`` sets its noise's std ``2 z M`` from ``privacy.clip`` as M, though it clips
  nothing.
- Attacks (``attack:``): the client's walk neighbours see w before and after its step, and
  (m, v) where they travel; :meth:`RandomWalkMeta.attack_surface` simulates that step for
  candidate records (flcore.attacks.surface.MetaStepSurface: the meta-gradient, clipped as the
  run clips, then each variant's rule, LoDMeta's private (m, v) as unknowns). With
  ``attack.known: rest`` the attacked step is the client's real one and the attacker knows its
  other records (differential privacy's adversary): a one-record replay's release is mostly
  float32 rounding (five inner steps fit one record), the real step's is not.
  What the neighbours read off a step (BENCHMARKS.md, benchmarks/lodmeta_release.py): on a
  client's first visit its (m, v) are 0, so ``w - w'`` is an invertible map of g (cosine 0.99
  or more on FMNIST), and with theta 0 every step carries the signs of g; "only w is sent"
  does not hide the gradient from the two clients around the step.
- The step's ``train_loss`` and ``meta_grad_norm`` (the clean, unclipped norm) are the
  simulator's telemetry, logged for the experimenter and sent to no client: outside the
  guarantee, which covers what clients transmit.
- A delta at or above 1 / (records a client trains on) permits releasing a record outright:
  such runs are ``weak-delta``, at epsilon = inf (the accountant's figure stays in
  ``epsilon_accountant``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import Field

from flcore.algorithms.base import ALGORITHMS, ClientData, ClientResult, ClientTask
from flcore.algorithms.meta.base import MetaAlgorithm, MetaParams, Params
from flcore.algorithms.meta.maml import meta_gradient, tensors
from flcore.privacy.isrl import PerClientAccounting
from flcore.privacy.perturbation import ParameterPerturbation, network_dp_epsilon

__all__ = ["LoDMeta", "LoDMetaBasic", "LoDMetaParams", "LoDMetaSGD", "grad_norm"]


class WalkParams(MetaParams):
    theta: float = Field(0.0, ge=0, lt=1, description="first-order momentum weight (paper: 0)")
    beta: float = Field(0.99, ge=0, lt=1, description="second-order momentum weight (0.99)")
    lam: float = Field(1e-8, gt=0, description="lambda in sqrt(v + lambda)")


class LoDMetaParams(WalkParams):
    paper_exact: bool = Field(
        False, description="run Algorithm 2 as printed (clean m and v; not DP: dp_guarantee none)"
    )


def grad_norm(grads: Mapping[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values())))


def step_surface(
    alg: MetaAlgorithm,
    start: Mapping[str, torch.Tensor],
    rule: str,
    clip: float | None,
    token: Mapping[str, torch.Tensor] | None = None,
) -> Any:
    """The attack surface of one meta step of ``alg`` (flcore.attacks.surface.MetaStepSurface):
    ``start`` the broadcast ``w`` keyed as the upload names it, ``rule`` what the upload makes
    of the (``clip``-ped) meta-gradient, ``token`` the broadcast (m, v) where they travel. The
    network is the public initialisation, rebuilt (the surface rewrites its batch norm)."""
    from flcore.algorithms.base import seeded
    from flcore.attacks.surface import MetaStepSurface

    p = alg.params
    assert isinstance(p, WalkParams)
    model = seeded((alg.seed, 0x3E7A), alg.model_spec).to(alg.device)
    return MetaStepSurface(
        model,
        {k: v.to(alg.device) for k, v in start.items()},
        rule=rule,  # type: ignore[arg-type]  # the surface's rules are its names
        inner_steps=p.inner_steps,
        inner_lr=p.inner_lr,
        first_order=p.first_order,
        eta=float(alg.training.lr),
        theta=p.theta,
        beta=p.beta,
        lam=p.lam,
        clip=clip,
        token=None if token is None else {k: v.to(alg.device) for k, v in token.items()},
    )


class RandomWalkMeta(MetaAlgorithm):
    """A meta-model walking the graph; subclasses choose the optimizer state's home."""

    topology = "walk"
    privacy_mechanisms = frozenset({"perturbation"})
    Params = WalkParams
    #: ``local`` (each client's own m, v), ``token`` (m, v travel with w) or ``sgd``
    state_home: ClassVar[str] = "local"
    #: relative communication a step (Table 1)
    units: ClassVar[float] = 1.0

    # ------------------------------------------------------------------ server: the walk
    def init_server(self) -> None:
        self.w = self.initial_params()
        self.m = {k: torch.zeros_like(v) for k, v in self.w.items()}
        self.v = {k: torch.zeros_like(v) for k, v in self.w.items()}
        self.position = -1
        self.visits = [0] * self.num_clients
        self._accounting = (
            PerClientAccounting(self.privacy, epochs=1, batch_size=1)
            if self.privacy is not None
            else None
        )

    def sample_clients(
        self, round: int, rng: np.random.Generator, fraction: float, force_all: bool
    ) -> list[int]:
        """The client the walk reaches this step (its first: uniform)."""
        assert self.graph is not None, "a walk needs its graph"
        if self.position < 0:
            self.position = self.graph.start(rng)
        else:
            self.position = self.graph.step(self.position, rng)
        return [self.position]

    def broadcast(self, round: int, client_id: int) -> dict[str, torch.Tensor]:
        """The token the previous client sent: w, and (m, v) when they travel."""
        out = self.cpu(self.w, "w.")
        if self.state_home == "token":
            out |= self.cpu(self.m, "m.") | self.cpu(self.v, "v.")
        return out

    def accumulate(self, result: ClientResult) -> None:
        up = result.upload
        self.w = self.take(up, "w.")
        if self.state_home == "token":
            self.m, self.v = self.take(up, "m."), self.take(up, "v.")
        self.visits[result.client_id] += 1
        if self._accounting is not None:
            assert self.privacy is not None
            self._accounting.release(result.client_id, self.privacy.noise_multiplier)

    def end_round(self, round: int) -> None:
        pass

    def comm_units(self, client_ids: list[int]) -> float | None:
        return self.units * len(client_ids)

    def client_start(self, client_id: int, state: Any) -> Params:
        return self.w

    # ------------------------------------------------------------------ privacy
    def _paper_exact(self) -> bool:
        return bool(getattr(self.params, "paper_exact", False))

    def dp_guarantee(self) -> str:
        if self.privacy is not None and self._paper_exact():
            return "none"
        return super().dp_guarantee()

    def privacy_metrics(self) -> dict[str, float]:
        """``epsilon`` (the worst client's composed releases, or inf without a guarantee),
        ``epsilon_accountant``, ``epsilon_paper`` (Theorem 4.5, where defined)."""
        if self._accounting is None:
            return super().privacy_metrics()
        p = self.privacy
        assert p is not None
        metrics = self._accounting.metrics()
        # under paper_exact nothing is clipped and v sees the clean gradient: no sensitivity
        # bound, so the accountant's figure (for the clipped mechanism) describes no release
        metrics["epsilon_accountant"] = math.inf if self._paper_exact() else metrics["epsilon"]
        if self.dp_guarantee() in ("none", "weak-delta"):
            metrics["epsilon"] = math.inf
        steps = sum(self.visits)
        release_eps = (
            math.sqrt(2.0 * math.log(1.25 / p.delta)) / p.noise_multiplier
            if p.noise_multiplier > 0
            else math.inf  # no noise: Theorem 4.5 says nothing
        )
        if steps and release_eps < 1 and p.delta < 0.5:
            metrics["epsilon_paper"] = network_dp_epsilon(
                release_eps, p.delta, steps=steps, num_clients=self.num_clients, delta_hat=p.delta
            )
        return metrics

    # ------------------------------------------------------------------ attacks
    attackable = True
    attack_knows_rest = True

    def attack_surface(self, broadcast: dict[str, torch.Tensor], client_id: int) -> Any:
        """The step client ``client_id`` takes from the broadcast token, as its walk neighbours
        see it (flcore.attacks.surface.MetaStepSurface): the meta-gradient of candidate records,
        clipped as the run clips (not under ``paper_exact``, which does not), then the rule."""
        clip = None
        if self.privacy is not None and not self._paper_exact():
            clip = float(self.privacy.clip)
        w = {k: v for k, v in broadcast.items() if k.startswith("w.")}
        token = {k: v for k, v in broadcast.items() if not k.startswith("w.")}
        return step_surface(self, w, self.state_home, clip, token or None)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "w": self.cpu(self.w),
            "m": self.cpu(self.m),
            "v": self.cpu(self.v),
            "position": self.position,
            "visits": list(self.visits),
            "privacy": self._accounting.state_dict() if self._accounting is not None else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.w = self.take(state["w"])
        self.m, self.v = self.take(state["m"]), self.take(state["v"])
        self.position = int(state["position"])
        self.visits = list(state["visits"])
        if self._accounting is not None:
            self._accounting.load_state_dict(state["privacy"])

    # ------------------------------------------------------------------ client
    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        p = self.params
        assert isinstance(p, WalkParams)
        assert data.val is not None, "a few-shot client has a query set"
        w = self.take(task.payload, "w.")
        support = tensors(data.train, data.info, self.device)
        query = tensors(data.val, data.info, self.device)
        g, loss = meta_gradient(
            self.net(),
            w,
            support,
            query,
            steps=p.inner_steps,
            lr=p.inner_lr,
            first_order=p.first_order,
        )
        metrics = {"train_loss": loss, "meta_grad_norm": grad_norm(g)}
        exact_noise: Params | None = None
        if self.privacy is not None:
            mech = ParameterPerturbation(self.privacy.noise_multiplier, self.privacy.clip)
            if self._paper_exact():  # Algorithm 2 as printed: noise joins m at line 13
                zero = {k: torch.zeros_like(v) for k, v in g.items()}
                exact_noise = mech.perturb(zero, generator)
            else:  # one noisy gradient, what m and v are built from
                g = mech.perturb(mech.clip_update(g), generator)
        eta = self.training.lr
        upload: dict[str, torch.Tensor]
        state: Any = task.state
        if self.state_home == "sgd":
            new_w = {k: w[k] - eta * g[k] for k in w}
            upload = self.cpu(new_w, "w.")
        else:
            if self.state_home == "token":
                m, v = self.take(task.payload, "m."), self.take(task.payload, "v.")
            elif task.state is not None:
                m, v = self.take(task.state["m"]), self.take(task.state["v"])
            else:
                m = {k: torch.zeros_like(x) for k, x in w.items()}
                v = {k: torch.zeros_like(x) for k, x in w.items()}
            m = {k: p.theta * m[k] + (1 - p.theta) * g[k] for k in w}
            v = {k: p.beta * v[k] + (1 - p.beta) * g[k].pow(2) for k in w}
            top = m if exact_noise is None else {k: m[k] + exact_noise[k] for k in w}
            new_w = {k: w[k] - eta * top[k] / torch.sqrt(v[k] + p.lam) for k in w}
            upload = self.cpu(new_w, "w.")
            if self.state_home == "token":
                upload |= self.cpu(m, "m.") | self.cpu(v, "v.")
            else:
                state = {"m": self.cpu(m), "v": self.cpu(v)}
        return ClientResult(task.client_id, len(data.train) + len(data.val), upload, state, metrics)


@ALGORITHMS.register("lodmeta")
class LoDMeta(RandomWalkMeta):
    """Algorithm 2: each client's own (m, v); only w travels."""

    name = "lodmeta"
    Params = LoDMetaParams
    state_home = "local"
    units = 1.0


@ALGORITHMS.register("lodmeta_basic")
class LoDMetaBasic(RandomWalkMeta):
    """Algorithm 1: (w, m, v) travel together."""

    name = "lodmeta_basic"
    state_home = "token"
    units = 3.0


@ALGORITHMS.register("lodmeta_sgd")
class LoDMetaSGD(RandomWalkMeta):
    """LoDMeta(SGD): ``w <- w - eta g``."""

    name = "lodmeta_sgd"
    state_home = "sgd"
    units = 1.0
