"""The server's differentiable simulation of what a client uploads.

A gradient-inversion attack needs, for a candidate record ``(x, y)``, the gradient that record
would have put into the client's upload. That is public knowledge: the architecture and the
training protocol are the algorithm's, and everything the simulation uses is either the
broadcast (what the server sent) or a public initial value. Client-private tensors that shape
the upload (CENTAUR's or pFedHN-PC's head, HyperFL's embedding and head, PPSGD's personal
offset) are ``unknowns``: the simulation takes them as arguments, starting from the protocol's
public initial values, and attacks optimise them jointly with the images (the paper's "all the
unknown variables are learnable").

Each algorithm builds its surface (``Algorithm.attack_surface``); the attacks only call
:meth:`GradientSurface.gradient`, which is a pure function of ``(unknowns, x, y)`` so
``torch.func.vmap`` can batch independent reconstructions.

The upload becomes a target gradient by :meth:`GradientSurface.pseudo_gradient`: for one SGD
step from ``start`` (a fresh optimiser, so momentum's first buffer is the gradient itself),
``upload = start - lr (g + wd start)``, hence ``g = (start - upload) / lr - wd start`` exactly.
For ``K`` local steps the same formula with ``lr K`` treats the total move as a scaled gradient,
as HyperFL's evaluation does (Zhang et al. 2019's approximation); cosine matching does not
depend on the scale. Clipping (DP-SGD's, HyperFL's grad-norm clip) scales it too.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad

__all__ = [
    "AlternatingSurface",
    "GradientSurface",
    "HyperSurface",
    "MetaStepSurface",
    "ModelSurface",
]

TensorDict = dict[str, torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]  # normalised images and their labels


class GradientSurface(ABC):
    """What a server can compute about one client's upload.

    Attributes:
        start: the uploaded tensors' values before the client trained (from the broadcast).
        unknowns: public initial values of the client-private tensors the upload depends on.
        upload_kind: ``weights`` (the upload is the trained tensors) or ``delta`` (trained minus
            start, as pFedHN's clients send).
        label_key: the classifier bias among the uploaded tensors, when it is uploaded (its
            gradient gives the label away: iDLG), else None.
        known: the client's other records the attacker knows (:meth:`knowing`): its support
            set and query set, or None.
    """

    def __init__(
        self,
        start: Mapping[str, torch.Tensor],
        unknowns: Mapping[str, torch.Tensor] | None = None,
        *,
        upload_kind: Literal["weights", "delta"] = "weights",
        label_key: str | None = None,
    ) -> None:
        self.start = {k: v.detach() for k, v in start.items()}
        self.unknowns = {k: v.detach().clone() for k, v in (unknowns or {}).items()}
        self.upload_kind = upload_kind
        self.label_key = label_key if label_key in self.start else None
        self.known: tuple[Batch, Batch] | None = None

    @abstractmethod
    def gradient(self, unknowns: TensorDict, x: torch.Tensor, y: torch.Tensor) -> TensorDict:
        """The gradient of the mean cross-entropy of ``(x, y)`` with respect to ``start``'s
        tensors, with the private tensors set to ``unknowns``. Pure and differentiable in
        ``x`` and ``unknowns``; ``x`` is ``[b, C, H, W]`` (normalised), ``y`` is ``[b]``."""

    def prepare_targets(self, targets: Sequence[TensorDict]) -> TensorDict:
        """Stack target gradients (one per reconstruction) in the form :meth:`match` reads;
        a surface may precompute what every iteration would otherwise recompute."""
        return {k: torch.stack([t[k] for t in targets]) for k in targets[0]}

    def match(
        self,
        unknowns: TensorDict,
        x: torch.Tensor,
        y: torch.Tensor,
        target: TensorDict,
        distance: Callable[[TensorDict, TensorDict], torch.Tensor],
    ) -> torch.Tensor:
        """``distance(gradient(unknowns, x, y), target)`` for one reconstruction, ``target``
        being one slice of :meth:`prepare_targets`; a surface may compute a known distance in
        a cheaper, equivalent form."""
        return distance(self.gradient(unknowns, x, y), target)

    def knowing(
        self,
        support: Batch,
        query: Batch | None = None,
    ) -> GradientSurface:
        """This surface for an attacker that knows every record of the client's step but the
        attacked ones (the adversary of differential privacy's neighbouring relation;
        ``attack.known: rest``): ``support`` holds the client's other training records, and
        ``query`` its held-out records where the step uses them (a meta step's query set),
        each as normalised images and labels. The candidate records join ``support``, and
        :meth:`gradient` simulates the client's real step. Only a surface whose step is one
        full-batch gradient (order-free) can say so; the others refuse."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot simulate a step with known records: its update "
            "is not one full-batch gradient of the client's set"
        )

    def pseudo_gradient(
        self, upload: Mapping[str, torch.Tensor], training: object, steps: int
    ) -> TensorDict:
        """The gradient an upload implies (exact for one fresh SGD step; see module doc)."""
        lr = float(training.lr)  # type: ignore[attr-defined]
        wd = float(getattr(training, "weight_decay", 0.0))
        out = {}
        for k, s in self.start.items():
            if k not in upload:
                raise KeyError(f"the upload has no {k!r}: it does not match this surface")
            u = upload[k].to(s.device, s.dtype)
            moved = s - u if self.upload_kind == "weights" else -u
            out[k] = moved / (lr * steps) - wd * s
        return out


def _ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, y)


class ModelSurface(GradientSurface):
    """A network whose uploaded tensors are some of its own parameters.

    Args:
        model: the public architecture (its own tensors fill whatever is not given).
        start: the uploaded parameters' values before training (the broadcast).
        fixed: other known tensors (e.g. a frozen backbone), by state-dict key.
        unknowns: private parameters by state-dict key, at their public initial values.
        offset: the unknowns are additive offsets of every uploaded parameter (PPSGD's
            personal part ``theta_i``: the client's network is ``w + theta_i``).
    """

    def __init__(
        self,
        model: nn.Module,
        start: Mapping[str, torch.Tensor],
        *,
        fixed: Mapping[str, torch.Tensor] | None = None,
        unknowns: Mapping[str, torch.Tensor] | None = None,
        offset: bool = False,
        upload_kind: Literal["weights", "delta"] = "weights",
        label_key: str | None = None,
    ) -> None:
        params = dict(model.named_parameters())
        start = {k: v for k, v in start.items() if k in params}  # buffers carry no gradient
        super().__init__(start, unknowns, upload_kind=upload_kind, label_key=label_key)
        self.model = model.eval()
        self.fixed = {k: v.detach() for k, v in (fixed or {}).items()}
        self.offset = offset
        if offset and set(self.unknowns) != set(self.start):
            raise ValueError("offset unknowns must cover exactly the uploaded parameters")

    def gradient(self, unknowns: TensorDict, x: torch.Tensor, y: torch.Tensor) -> TensorDict:
        def loss(shared: TensorDict) -> torch.Tensor:
            if self.offset:
                params = self.fixed | {k: shared[k] + unknowns[k] for k in shared}
            else:
                params = self.fixed | dict(unknowns) | shared
            return _ce(functional_call(self.model, params, (x,)), y)

        return grad(loss)(self.start)

    def logits(self, unknowns: TensorDict, x: torch.Tensor) -> torch.Tensor:
        """The simulated network's output (for checks and label guesses)."""
        if self.offset:
            params = self.fixed | {k: self.start[k] + unknowns[k] for k in self.start}
        else:
            params = self.fixed | dict(unknowns) | self.start
        return functional_call(self.model, params, (x,))


class HyperSurface(GradientSurface):
    """HyperFL: the upload is a hypernetwork ``h(.; phi)`` that generates the extractor from the
    client's private embedding; the client's private head reads the extractor's output.

    Args:
        hnet: the public hypernetwork architecture.
        model: the client network (``features`` generated, ``head`` private).
        start: the hypernetwork's broadcast parameters.
        unknowns: ``embedding`` and the head's ``head.*`` tensors, at their public initial values.
    """

    def __init__(
        self,
        hnet: nn.Module,
        model: nn.Module,
        start: Mapping[str, torch.Tensor],
        unknowns: Mapping[str, torch.Tensor],
    ) -> None:
        super().__init__(start, unknowns)
        self.hnet = hnet.eval()
        self.model = model.eval()

    def generate(self, embedding: torch.Tensor, phi: Mapping[str, torch.Tensor] | None = None):  # type: ignore[no-untyped-def]
        """The extractor weights ``h(embedding; phi)`` (default phi: the broadcast)."""
        return functional_call(self.hnet, dict(phi or self.start), (embedding,))

    def _head(self, unknowns: TensorDict) -> TensorDict:
        return {k.removeprefix("head."): v for k, v in unknowns.items() if k.startswith("head.")}

    def gradient(self, unknowns: TensorDict, x: torch.Tensor, y: torch.Tensor) -> TensorDict:
        def loss(phi: TensorDict) -> torch.Tensor:
            theta = self.generate(unknowns["embedding"], phi)
            feats = functional_call(self.model.features, theta, (x,))
            return _ce(functional_call(self.model.head, self._head(unknowns), (feats,)), y)

        return grad(loss)(self.start)

    def prepare_targets(self, targets: Sequence[TensorDict]) -> TensorDict:
        """Each head's weight target ``T_k`` (``numel_k x hidden``) as an exact thin
        factorisation ``U_k diag(S_k) V_k^T``: singular values below 1e-6 of the largest carry
        less than 1e-12 of its energy and are dropped. A one-step update of one record is rank
        one, so matching then reads ``U_k`` (one column) instead of ``T_k`` (128 columns); a
        full-rank target (noise, many steps) keeps every component and loses nothing. The
        squared norm of the whole target is kept too. Ranks are padded with zero components
        to the batch's largest so the reconstructions stack."""
        hnet = self.hnet
        out = super().prepare_targets(
            [
                {k: v for k, v in t.items() if not k.endswith(".weight") or k.startswith("body.")}
                for t in targets
            ]
        )
        out["__sq__"] = torch.stack([sum(v.pow(2).sum() for v in t.values()) for t in targets])
        for i in range(len(hnet.names)):
            key = f"heads.{i}.weight"
            factors = []
            for t in targets:
                m = t[key].double()  # squaring in float32 would blur ranks at 1e-4
                evals, vecs = torch.linalg.eigh(m.t() @ m)  # m^T m = V S^2 V^T
                sv = evals.clamp(min=0).sqrt()
                keep = sv > 1e-6 * sv.max().clamp(min=1e-30)
                v, sv = vecs[:, keep], sv[keep]
                u = (m @ v) / sv  # numel x r, orthonormal columns
                dtype = t[key].dtype
                factors.append((u.to(dtype), sv.to(dtype), v.to(dtype)))
            r = max(1, max(len(sv) for _, sv, _ in factors))
            pad = lambda a, n: torch.cat([a, a.new_zeros(*a.shape[:-1], n - a.shape[-1])], -1)  # noqa: E731
            out[f"{key}.U"] = torch.stack([pad(u, r) for u, _, _ in factors])
            out[f"{key}.SVt"] = torch.stack([pad(v * sv, r).t() for _, sv, v in factors])
        return out

    def match(
        self,
        unknowns: TensorDict,
        x: torch.Tensor,
        y: torch.Tensor,
        target: TensorDict,
        distance: Callable[[TensorDict, TensorDict], torch.Tensor],
    ) -> torch.Tensor:
        """The cosine and L2 distances in factored form, never forming the hypernetwork's
        gradient (14.9M numbers for the FMNIST CNN).

        Each generated tensor is ``theta_k = W_k a + b_k`` with ``a`` the body's output, so
        ``dL/dW_k = g_k a^T`` and ``dL/db_k = g_k`` with ``g_k = dL/dtheta_k``. Hence
        ``<dL/dW_k, T_k> = g_k . (T_k a)`` and ``|dL/dW_k|^2 = |g_k|^2 |a|^2``; the body's
        gradient is small and computed as it is. Equal to :meth:`gradient` then ``distance``
        (a test checks it) at a fraction of the cost.
        """
        from flcore.attacks.gradmatch import cosine_distance, l2_distance

        if distance not in (cosine_distance, l2_distance):
            raise ValueError(f"HyperSurface matches cosine or L2 distances, not {distance!r}")
        hnet = self.hnet
        body = {k.removeprefix("body."): v for k, v in self.start.items() if k.startswith("body.")}
        heads = [
            (self.start[f"heads.{i}.weight"], self.start[f"heads.{i}.bias"], name, shape)
            for i, (name, shape) in enumerate(zip(hnet.names, hnet.shapes, strict=True))
        ]
        zeros = {
            name: torch.zeros(shape, dtype=x.dtype, device=x.device) for _, _, name, shape in heads
        }

        def loss(body_p: TensorDict, delta: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
            a = functional_call(hnet.body, body_p, (unknowns["embedding"],))
            theta = {
                name: F.linear(a, w, b).view(shape) + delta[name] for w, b, name, shape in heads
            }
            feats = functional_call(self.model.features, theta, (x,))
            out = functional_call(self.model.head, self._head(unknowns), (feats,))
            return _ce(out, y), a

        (g_body, g_theta), a = grad(loss, argnums=(0, 1), has_aux=True)(body, zeros)
        dot = sum((g_body[k] * target[f"body.{k}"]).sum() for k in g_body)
        pred_sq = sum(g.pow(2).sum() for g in g_body.values())
        tgt_sq = target["__sq__"]
        a_sq = a.pow(2).sum()
        for i, (_, _, name, _) in enumerate(heads):
            g = g_theta[name].flatten()
            u, svt = target[f"heads.{i}.weight.U"], target[f"heads.{i}.weight.SVt"]
            dot = dot + (g @ u) @ (svt @ a) + g @ target[f"heads.{i}.bias"]
            pred_sq = pred_sq + g.pow(2).sum() * (a_sq + 1)
        if distance is cosine_distance:
            return 1 - dot / (pred_sq.sqrt() * tgt_sq.sqrt() + 1e-12)
        return pred_sq - 2 * dot + tgt_sq


class _BatchStatsNorm(nn.Module):
    """A batch norm layer that normalises with the batch's own statistics (as
    ``torch.func.replace_all_batch_norm_modules_`` leaves one), written in elementary ops so
    that autograd differentiates it to any order: ``F.batch_norm`` stops at the second (its
    saved batch statistics carry no history, pytorch/pytorch#186256: plain autograd refuses a
    third, under ``torch.func`` torch 2.14 returns a wrong one silently), and an
    attack on a second-order MAML step differentiates the network three times. Keeps the
    layer's ``weight`` and ``bias`` under their names, so parameter dicts still apply."""

    def __init__(self, bn: nn.modules.batchnorm._BatchNorm) -> None:
        super().__init__()
        self.eps = bn.eps
        self.weight = bn.weight
        self.bias = bn.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = [0, *range(2, x.dim())]
        centred = x - x.mean(dims, keepdim=True)
        out = centred / torch.sqrt(centred.pow(2).mean(dims, keepdim=True) + self.eps)
        if self.weight is None:
            return out
        shape = [1, -1] + [1] * (x.dim() - 2)
        return out * self.weight.view(shape) + self.bias.view(shape)


def batch_stats_norm_(model: nn.Module) -> nn.Module:
    """Replace, in place, every batch norm layer of ``model`` by :class:`_BatchStatsNorm`
    (batch statistics, differentiable to any order); returns ``model``."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            setattr(model, name, _BatchStatsNorm(child))
        else:
            batch_stats_norm_(child)
    return model


def _knowing_task(
    surface: GradientSurface, support: Batch, query: Batch | None, needs_query: str
) -> Any:
    """A copy of a few-shot client's ``surface`` whose attacker knows the client's other support
    records and its query set (``known``), on the surface's device; ``needs_query`` is the
    error when the query set is missing."""
    if query is None:
        raise ValueError(needs_query)
    device = next(iter(surface.start.values())).device
    out = copy.copy(surface)
    out.known = (
        (support[0].to(device), support[1].to(device)),
        (query[0].to(device), query[1].to(device)),
    )
    return out


class MetaStepSurface(GradientSurface):
    """LoDMeta's walk (and its baselines): what client i sends is one step of the walking
    meta-model ``w``, made from the MAML meta-gradient of its task (flcore.algorithms.meta);
    or, for server-based MAML (``fedmaml``), the meta-gradient itself.

    The attacker is i's predecessor and successor on the walk, colluding (or one client j on a
    walk j -> i -> j): it sees ``w`` before and after i's step, and (m, v) too where they
    travel (``lodmeta_basic``). What the step gives away, by rule:

    - ``sgd`` (``lodmeta_sgd``): ``w' = w - eta g``: the gradient, ``(w - w') / eta``.
    - ``token`` (``lodmeta_basic``): the new m is in the token: ``g = (m' - theta m) /
      (1 - theta)`` with the old m from the broadcast token.
    - ``gradient`` (``fedmaml``): the upload is the meta-gradient (keyed ``g.<name>``), which
      the server reads as it is: the attacker is the server.
    - ``local`` (``lodmeta``): ``(w - w') / eta = m' / sqrt(v' + lambda)`` with ``m' = theta m +
      (1 - theta) g`` and ``v' = beta v + (1 - beta) g^2`` built from the client's own (m, v).
      Those are private: they are ``unknowns`` (``m.*``, ``v.*``), at their public initial
      value 0, which is exact on the client's first visit, and optimised jointly with the images
      after it (``v`` clamped at 0). The simulation is the released quantity itself, the
      elementwise map of ``g`` above; at ``lambda`` 1e-8 and beta 0.99 it is close to ``10
      sign(g)`` wherever ``|g| >> 1e-3``, so the step carries the gradient's signs and little of
      its magnitudes.

    ``g`` is the meta-gradient of the candidate records used as the task's support and query
    sets alike (the leakage evaluation replays the client's step on the attacked records alone:
    :meth:`flcore.algorithms.meta.base.MetaAlgorithm.replay_data`), or, for an attacker that
    knows the client's other records (:meth:`knowing`), of the client's real task: its other
    support records with the candidates, and its query set; clipped to ``clip`` where the run
    clips; DP noise is not simulated (the attacker does not know it). The network runs
    with batch statistics and no running ones, as a client's training forward does, its batch
    norm layers written out (:func:`batch_stats_norm_`) so that the attack's derivative in the
    records is exact: second-order, that is the network's third derivative.

    Args:
        model: the public network (its batch norm layers are replaced in place).
        start: ``w`` as broadcast, keyed as uploaded (``w.<name>``; ``g.<name>`` for
            ``gradient``).
        rule: ``sgd``, ``token``, ``local`` or ``gradient`` (above).
        inner_steps, inner_lr, first_order: the MAML inner loop.
        eta, theta, beta, lam: the walk's update.
        clip: the L2 bound of the meta-gradient (None: not clipped).
        token: the broadcast (m, v) for ``token``, keyed ``m.<name>``, ``v.<name>``.
    """

    def __init__(
        self,
        model: nn.Module,
        start: Mapping[str, torch.Tensor],
        *,
        rule: Literal["sgd", "token", "local", "gradient"],
        inner_steps: int,
        inner_lr: float,
        first_order: bool,
        eta: float,
        theta: float,
        beta: float,
        lam: float,
        clip: float | None,
        token: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        #: the prefix of the uploaded tensors' names: the step's weights, or the gradient
        self.key = "g." if rule == "gradient" else "w."
        if any(not k.startswith(self.key) for k in start):
            raise ValueError(f"rule {rule!r} uploads tensors named {self.key}<name>")
        names = [k.removeprefix(self.key) for k in start]
        unknowns = None
        if rule == "local":
            zeros = {k: torch.zeros_like(v) for k, v in start.items()}
            unknowns = {f"m.{k[2:]}": z for k, z in zeros.items()} | {
                f"v.{k[2:]}": z.clone() for k, z in zeros.items()
            }
        super().__init__(start, unknowns)
        self.model = batch_stats_norm_(model)
        self.names, self.rule = names, rule
        self.inner_steps, self.inner_lr, self.first_order = inner_steps, inner_lr, first_order
        self.eta, self.theta, self.beta, self.lam, self.clip = eta, theta, beta, lam, clip
        self.token = {k: v.detach() for k, v in (token or {}).items()}
        if rule == "token" and set(self.token) != {f"{p}.{n}" for p in "mv" for n in names}:
            raise ValueError("rule 'token' needs the broadcast m.* and v.* tensors")

    def knowing(
        self,
        support: Batch,
        query: Batch | None = None,
    ) -> MetaStepSurface:
        """See :meth:`GradientSurface.knowing`: a meta step's support loss and query loss are
        means over their sets, and batch statistics do not depend on order, so the candidates
        may sit at the end of the support set. The query set is required."""
        return _knowing_task(
            self, support, query, "a meta step's attacker who knows the rest knows its query set"
        )

    def meta_gradient(self, x: torch.Tensor, y: torch.Tensor) -> TensorDict:
        """The MAML meta-gradient at ``w`` of the task whose support and query sets are both
        ``(x, y)`` (with known records, :meth:`knowing`: the support set is the known ones and
        ``(x, y)``, the query set the known one), keyed by parameter name (unclipped),
        differentiable in ``x``.

        First order, the released value is the query gradient at the adapted weights,
        ``grad L(u_K)``, with ``u_K``'s dependence on ``w`` dropped; its dependence on the
        records is not: ``u_K`` is built from their support gradients, and an attack
        differentiating the release in ``x`` must go through it (cutting it, as detaching the
        inner gradients would, leaves the value right and its derivative in ``x`` partial)."""

        (sx, sy), (qx, qy) = (x, y), (x, y)
        if self.known is not None:
            (kx, ky), (qx, qy) = self.known
            sx, sy = torch.cat([kx, x]), torch.cat([ky, y])

        def support(params: TensorDict) -> torch.Tensor:
            return _ce(functional_call(self.model, params, (sx,)), sy)

        def query(params: TensorDict) -> torch.Tensor:
            return _ce(functional_call(self.model, params, (qx,)), qy)

        def adapt(w: TensorDict) -> TensorDict:
            u = w
            for _ in range(self.inner_steps):
                g = grad(support)(u)
                u = {k: u[k] - self.inner_lr * g[k] for k in u}
            return u

        w = {n: self.start[f"{self.key}{n}"] for n in self.names}
        if self.first_order:
            return grad(query)(adapt(w))
        return grad(lambda w: query(adapt(w)))(w)

    def gradient(self, unknowns: TensorDict, x: torch.Tensor, y: torch.Tensor) -> TensorDict:
        """What the step releases of ``(x, y)``'s meta-gradient, as :meth:`pseudo_gradient`
        reads it off an upload (class docstring)."""
        g = self.meta_gradient(x, y)
        if self.clip is not None:
            norm = torch.sqrt(sum(v.pow(2).sum() for v in g.values()))
            g = {k: v * torch.clamp(self.clip / (norm + 1e-12), max=1.0) for k, v in g.items()}
        if self.rule != "local":
            return {f"{self.key}{k}": v for k, v in g.items()}
        out = {}
        for k, v in g.items():
            m = self.theta * unknowns[f"m.{k}"] + (1 - self.theta) * v
            second = self.beta * unknowns[f"v.{k}"].clamp(min=0) + (1 - self.beta) * v.pow(2)
            out[f"w.{k}"] = m / torch.sqrt(second + self.lam)
        return out

    def pseudo_gradient(
        self, upload: Mapping[str, torch.Tensor], training: object, steps: int
    ) -> TensorDict:
        """What the upload releases, in :meth:`gradient`'s terms (exact: one step of a known
        rule; ``training`` and ``steps`` are not needed)."""
        out = {}
        for n in self.names:
            s = self.start[f"{self.key}{n}"]
            if self.rule == "gradient":
                out[f"g.{n}"] = upload[f"g.{n}"].to(s.device, s.dtype)
            elif self.rule == "token":
                m_new = upload[f"m.{n}"].to(s.device, s.dtype)
                m_old = self.token[f"m.{n}"].to(s.device, s.dtype)
                out[f"w.{n}"] = (m_new - self.theta * m_old) / (1 - self.theta)
            else:
                out[f"w.{n}"] = (s - upload[f"w.{n}"].to(s.device, s.dtype)) / self.eta
        return out


class AlternatingSurface(GradientSurface):
    """FedAlt's client (flcore.algorithms.meta.fedalt): from the broadcast shared part ``u``
    and its own personal head ``v``, ``steps`` full-batch SGD steps on ``v`` (``u`` fixed),
    then as many on ``u`` (the new ``v`` fixed); it uploads the new ``u`` to the server, the
    attacker. The head is private: it is the ``unknowns`` (``v.<name>``), at its public initial
    value, which is exact on the client's first round and optimised with the images after it.

    :meth:`gradient` simulates the whole local update, differentiably in the records (through
    all ``2 steps`` steps: the network's second derivative, with batch statistics written out
    as :func:`batch_stats_norm_` does), and returns the total move over the step size,
    ``(u - u') / lr``, which :meth:`pseudo_gradient` reads off the upload exactly. The data of
    the update are the candidate records, twice (the leakage evaluation's one-record replay is
    the task's support and its query set alike, and FedAlt trains on both), or, for an
    attacker who knows the rest (:meth:`knowing`), the client's other support records, the
    candidates and its query set: full-batch means and batch statistics do not depend on order.

    Args:
        model: the public network (its batch norm layers are replaced in place).
        start: ``u`` as broadcast, keyed as uploaded (``u.<name>``).
        head: the personal head's public initial value, keyed by parameter name.
        steps, lr: the local steps on each part and their step size.
    """

    def __init__(
        self,
        model: nn.Module,
        start: Mapping[str, torch.Tensor],
        *,
        head: Mapping[str, torch.Tensor],
        steps: int,
        lr: float,
    ) -> None:
        if any(not k.startswith("u.") for k in start):
            raise ValueError("FedAlt uploads its shared part, named u.<name>")
        super().__init__(start, {f"v.{k}": v for k, v in head.items()})
        self.model = batch_stats_norm_(model)
        self.names = [k.removeprefix("u.") for k in start]
        self.steps, self.lr = steps, lr

    def knowing(self, support: Batch, query: Batch | None = None) -> AlternatingSurface:
        """See :meth:`GradientSurface.knowing` (the query set is required: FedAlt trains on
        it too)."""
        return _knowing_task(
            self, support, query, "FedAlt trains on the query set too: the attacker needs it"
        )

    def gradient(self, unknowns: TensorDict, x: torch.Tensor, y: torch.Tensor) -> TensorDict:
        if self.known is not None:
            (kx, ky), (qx, qy) = self.known
            data, labels = torch.cat([kx, x, qx]), torch.cat([ky, y, qy])
        else:
            data, labels = torch.cat([x, x]), torch.cat([y, y])
        u0 = {n: self.start[f"u.{n}"] for n in self.names}
        head = {k.removeprefix("v."): v for k, v in unknowns.items()}

        def loss(shared: TensorDict, personal: TensorDict) -> torch.Tensor:
            return _ce(functional_call(self.model, shared | personal, (data,)), labels)

        for _ in range(self.steps):
            g = grad(lambda h: loss(u0, h))(head)
            head = {k: head[k] - self.lr * g[k] for k in head}
        u = u0
        for _ in range(self.steps):
            g = grad(lambda s: loss(s, head))(u)
            u = {k: u[k] - self.lr * g[k] for k in u}
        return {f"u.{n}": (u0[n] - u[n]) / self.lr for n in self.names}

    def pseudo_gradient(
        self, upload: Mapping[str, torch.Tensor], training: object, steps: int
    ) -> TensorDict:
        """``(u - u') / lr`` (exact: the simulation's own quantity)."""
        out = {}
        for n in self.names:
            s = self.start[f"u.{n}"]
            out[f"u.{n}"] = (s - upload[f"u.{n}"].to(s.device, s.dtype)) / self.lr
        return out
