"""The small Algorithm base: round-level hooks that the engine calls, one file per algorithm.

A round, as the engine drives it::

    ids = algorithm.sample_clients(round, rng, ...)          # server (or a random walk)
    algorithm.begin_round(round, ids)
    for each id (in parallel workers, results consumed in id order):
        task.payload = algorithm.broadcast(round, id)         # what the server sends: bytes_down
        result = algorithm.local_update(data, task, gen)      # client: bytes_up = upload
        algorithm.accumulate(result)                          # streamed aggregation, no N copies
    algorithm.end_round(round)

Why these hooks fit the later papers:
- HyperFL uploads only its hypernetwork: ``upload`` holds exactly what leaves the client, and the
  classifier and embedding stay in ``ClientResult.state``, which the engine keeps for the client
  (the server never reads it).
- FedHKD sends per-class statistics beside weights: ``upload`` is any dict of tensors.
- Pa3dFL gives clients models of different widths: ``broadcast`` is per client.
- LoDMeta has no server: ``sample_clients`` returns the one client a random walk reaches, and
  ``accumulate`` keeps that client's model as the walking token.

``local_update`` runs in a worker process: it may use only its arguments and the immutable
construction arguments of the algorithm, never server state.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, ValidationError
from torch import nn

from flcore.capacity import Capacity
from flcore.data import ArrayDataset, DatasetInfo
from flcore.errors import ConfigError
from flcore.models import SplitModel, build_model
from flcore.privacy.settings import PrivacySettings
from flcore.registry import Registry

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AlgorithmParams",
    "ClientData",
    "ClientResult",
    "ClientTask",
    "LocalTraining",
    "ModelSpec",
    "seeded",
    "tensor_bytes",
]

TensorDict = dict[str, torch.Tensor]


class AlgorithmParams(BaseModel):
    """Base of each algorithm's ``algorithm_params`` schema: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class LocalTraining:
    """Public local-training hyperparameters (the server knows them too: the threat model)."""

    epochs: int
    batch_size: int
    lr: float
    optimizer: str = "sgd"
    momentum: float = 0.5
    weight_decay: float = 5e-4
    #: the lr of round t is lr x lr_decay^floor((t-1) / lr_decay_every): Pa3dFL's 0.998 every
    #: round, FedHKD's halving every 10 rounds
    lr_decay: float = 1.0
    lr_decay_every: int = 1

    def lr_at(self, round: int | None) -> float:
        """The local learning rate of ``round`` (1-based; None: the first round's)."""
        steps = (max(1, round or 1) - 1) // self.lr_decay_every
        return self.lr * self.lr_decay**steps


@dataclass(frozen=True)
class ModelSpec:
    """A picklable recipe for the model, so worker processes build the same network."""

    name: str
    num_classes: int
    in_channels: int
    kwargs: tuple[tuple[str, Any], ...] = ()

    def __call__(self, **overrides: Any) -> SplitModel:
        kw = dict(self.kwargs) | overrides
        return build_model(
            self.name, num_classes=self.num_classes, in_channels=self.in_channels, **kw
        )


@dataclass(frozen=True)
class ClientData:
    """One client's private data, as uint8 tensors plus the dataset's normalisation."""

    client_id: int
    train: ArrayDataset
    test: ArrayDataset
    info: DatasetInfo
    #: the client's validation records (a ``client_split`` with val > 0), or None
    val: ArrayDataset | None = None
    #: the public set every client shares (``public_samples``: FedMD's), or None
    public: ArrayDataset | None = None
    #: the classes of the client's whole training set when ``train`` holds only some of its
    #: records (the leakage evaluation's replay of the attacked records); None: ``train``'s own
    train_classes: torch.Tensor | None = None

    def classes(self) -> torch.Tensor:
        """The classes the client's training set holds (sorted, ``train_classes`` when given):
        a client property, such as HeteroFL's loss mask, not one of the batch at hand."""
        if self.train_classes is not None:
            return self.train_classes
        return self.train.labels.unique()


@dataclass(frozen=True)
class VectorJob:
    """One client's local work as the vectorized executor runs it: E epochs of the configured
    SGD (momentum, weight decay) on the cross-entropy of the trainable parameters, from
    ``start``, at learning rate ``lr``, with DP-SGD when the run's mechanism is ``dpsgd``.

    Attributes:
        start: the weights training starts from (at least every trainable parameter).
        lr: this round's local learning rate.
        prox_mu: a proximal term's mu: ``mu (w - anchor)`` joins each step's gradient (0: none).
        anchor: the proximal term's anchor (None: ``start``, FedProx's w^t).
        private: DP-SGD applies when the run's mechanism is ``dpsgd`` (False: a part that is
            never released, Ditto's personal model).
        then: a next training that follows on the same client generator (Ditto's personal
            model after the global one; HyperFL's hypernetwork step after its head step).
        epochs: local epochs of this training (None: the configured ones).
        trains: the names of the parameters this training updates (None: every trainable
            parameter of :meth:`Algorithm.vector_model`); the others enter the forward pass
            unchanged (HyperFL's head step holds the generator, its second step the head).
        clip: gradient-norm clipping after each backward pass, ``((names, max_norm), ...)``:
            each group's gradients are scaled together as ``torch.nn.utils.clip_grad_norm_``
            scales them (HyperFL clips its hypernetwork and its embedding apart).
        follows: start from the previous training's result instead of ``start`` (which is
            then unused): the two form one chain, as HyperFL's two steps on one model.
        lr_scale: ``((name, factor), ...)``: these parameters step at ``lr * factor`` (the
            loop's optimizer parameter groups; Pa3dFL's U and V at their layer's step scale).
        step_choices: a draw at every step (0: none): ``torch.randint(step_choices, (1,))``
            from the client's generator, after the epoch's shuffle and before the step, as a
            loop's loss function draws it (FjORD's width); the objective (an algorithm with
            :attr:`Algorithm.vector_objective`) is then called ``forward(x, y, mask, choice,
            step_choices)``, both a 0-dim integer tensor per client.
        consts: tensors of this client handed to the objective at every step, after the
            step's draws (HeteroFL: its width, for the Scaler); the clients' are stacked.
        class_mask: hand the objective, last, a ``[num_classes]`` boolean mask of the classes
            the client's training records hold (HeteroFL's masked cross-entropy).

    Trainings linked by ``follows`` form a chain. The first chain's result is the upload, the
    last chain's the model the client keeps; ``accuracy_before`` is taken at the start of the
    last chain, ``accuracy`` at its end, and ``train_loss`` is the last training of the first
    chain's (FedAvg: its one training; Ditto: the global model's; HyperFL: the generator's).
    """

    start: TensorDict
    lr: float
    prox_mu: float = 0.0
    anchor: TensorDict | None = None
    private: bool = True
    then: VectorJob | None = None
    epochs: int | None = None
    trains: tuple[str, ...] | None = None
    clip: tuple[tuple[tuple[str, ...], float], ...] = ()
    follows: bool = False
    lr_scale: tuple[tuple[str, float], ...] = ()
    step_choices: int = 0
    consts: tuple[torch.Tensor, ...] = ()
    class_mask: bool = False


@dataclass
class ClientTask:
    """What the engine asks of one client in one round."""

    client_id: int
    round: int
    payload: TensorDict
    state: Any
    evaluate: bool
    seed: int


@dataclass
class ClientResult:
    """What one client's round produced.

    Attributes:
        upload: exactly the tensors that leave the client (counted in ``bytes_up``).
        state: the client's private state, kept by the engine on its behalf; never aggregated.
        metrics: scalars such as ``train_loss`` and, on evaluation rounds, ``accuracy`` and
            ``accuracy_before`` (see :meth:`Algorithm.client_eval`).
    """

    client_id: int
    num_samples: int
    upload: TensorDict
    state: Any = None
    metrics: dict[str, float] = field(default_factory=dict)


def tensor_bytes(tensors: Mapping[str, torch.Tensor]) -> int:
    """Bytes of a dict of tensors as they travel (numel x element size)."""
    return int(sum(t.numel() * t.element_size() for t in tensors.values()))


def seeded(seed_words: tuple[int, ...], fn: Callable[[], Any]) -> Any:
    """Call ``fn`` with torch's global RNG seeded from ``seed_words`` and restore it afterwards.

    Parameter initialisation in ``torch.nn`` reads the global RNG; this keeps it reproducible
    without leaving a side effect on the caller's RNG.
    """
    seed = int(np.random.SeedSequence(list(seed_words)).generate_state(1, dtype=np.uint64)[0])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed % (2**63))
        return fn()


class Algorithm(ABC):
    """Base class of every FL algorithm. Subclasses register with ``@ALGORITHMS.register(name)``.

    Args:
        model_spec: builds the (client) network.
        training: the local-training hyperparameters.
        num_clients: total number of clients.
        params: this algorithm's validated ``algorithm_params``.
        seed: the experiment seed (for the server's initial model).
        device: torch device for computation.
        privacy: resolved DP settings (noise multiplier known), or None.
        capacity: the clients' capacities and widths (flcore.capacity), or None (every client
            full width). A ``capacity_aware`` algorithm gives client i width p_i; the others
            get a model already built at the narrowest width and use ``capacity`` only to
            report accuracy per width.
        graph: the communication graph of a ``walk`` or ``gossip`` algorithm
            (flcore.algorithms.meta.graph.Graph), else None.
    """

    name: ClassVar[str] = ""
    #: an algorithm that uploads nothing has no global model and nothing for an attack to see.
    uploads: ClassVar[bool] = True
    #: metrics the engine reports for this algorithm (sweep objectives are checked against it).
    reports: ClassVar[frozenset[str]] = frozenset(
        {
            "accuracy",
            "accuracy_before",
            "global_accuracy",
            "train_loss",
            "bytes_up",
            "bytes_down",
            "seconds",
            "epsilon",
        }
    )
    #: privacy mechanisms this algorithm can run with (``privacy.mechanism`` values).
    privacy_mechanisms: ClassVar[frozenset[str]] = frozenset()
    #: a mechanism this algorithm cannot run without (its DP variants).
    requires_privacy: ClassVar[str | None] = None
    #: pydantic schema of ``algorithm_params``.
    Params: ClassVar[type[AlgorithmParams]] = AlgorithmParams
    #: gives each client a model of its own width p_i (else: all train the narrowest width)
    capacity_aware: ClassVar[bool] = False
    #: needs the public set (``public_samples``) that every client sees (FedMD)
    requires_public: ClassVar[bool] = False
    #: releases something beside its model each round (FedHKD's class statistics): with
    #: DP-SGD it must run ``privacy.protect: knowledge+model`` (see :meth:`dp_side_release`)
    side_releases: ClassVar[bool] = False
    #: how clients talk: ``server`` (FL), ``walk`` (a model walks the ``graph``, one client a
    #: round: LoDMeta) or ``gossip`` (every client talks to its graph neighbours each round)
    topology: ClassVar[str] = "server"
    #: meta-learns over few-shot clients (``fewshot`` config, flcore.data.fewshot)
    needs_fewshot: ClassVar[bool] = False
    #: scalars of the clients' ``ClientResult.metrics`` the engine averages into each round's
    #: metrics beside ``train_loss`` (e.g. the meta family's ``meta_grad_norm``)
    client_metrics: ClassVar[tuple[str, ...]] = ()
    #: a client's round measures its own accuracy (``client_eval``); False: the server's
    #: ``evaluate_server`` measures every client instead (the meta family)
    client_evaluation: ClassVar[bool] = True
    #: gradient-inversion attacks can simulate its upload (``attack_surface``); False: an
    #: ``attack`` config is refused before any work
    attackable: ClassVar[bool] = True
    #: why an ``attack`` config is refused, where the reason is this class's own (None: the
    #: generic one, no surface simulates the upload)
    attack_refusal: ClassVar[str | None] = None
    #: its attack surface simulates the client's real step with every record but the attacked
    #: ones known (``attack.known: rest``, :meth:`GradientSurface.knowing`)
    attack_knows_rest: ClassVar[bool] = False
    #: the vectorized executor (flcore.vectorized) may train this class's clients: their local
    #: work is :class:`VectorJob`'s (SGD from a start point, optional proximal term and
    #: DP-SGD). Read through :meth:`vectorizable`: each class declares it for itself, so a
    #: subclass that changes the local work does not inherit it.
    vectorized: ClassVar[bool] = False
    #: the algorithm can train a model with static BatchNorm (HeteroFL's, ``*_sbn`` models); a
    #: class that rebuilds or gates the network's layers (Pa3dFL, FLANC, pFedGate) says False
    #: and such a config is refused before any work
    static_bn_ok: ClassVar[bool] = True

    def __init__(
        self,
        *,
        model_spec: ModelSpec,
        training: LocalTraining,
        num_clients: int,
        params: AlgorithmParams | Mapping[str, Any] | None = None,
        seed: int = 0,
        device: str = "cpu",
        privacy: PrivacySettings | None = None,
        capacity: Capacity | None = None,
        graph: Any = None,
    ) -> None:
        self.privacy = privacy
        self.capacity = capacity
        self.graph = graph
        self.model_spec = model_spec
        self.training = training
        self.num_clients = num_clients
        self.params = (
            params if isinstance(params, AlgorithmParams) else self.validate_params(params)
        )
        self.seed = seed
        self.device = torch.device(device)

    # ----------------------------------------------------------------- vectorized rounds
    @classmethod
    def vectorizable(cls) -> bool:
        """Whether this class itself (not a parent) declares ``vectorized``."""
        return bool(cls.__dict__.get("vectorized", False))

    def vector_unsupported(self) -> str | None:
        """Why this run's clients cannot be trained by the vectorized executor, or None."""
        if not self.vectorizable():
            return f"{self.name} trains its clients with its own local procedure"
        if self.training.optimizer != "sgd":
            return f"optimizer {self.training.optimizer!r} (the vectorized step is SGD's)"
        model = self.vector_model()
        if next(model.buffers(), None) is not None:
            return f"model {self.model_spec.name!r} has buffers (BatchNorm statistics)"
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            return (
                f"model {self.model_spec.name!r} has static BatchNorm (its evaluation needs "
                "statistics from each client's records, and zero-padded channels would train "
                "its bias)"
            )
        if any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules()):
            return f"model {self.model_spec.name!r} has dropout"
        return None

    def replay_data(self, data: ClientData) -> ClientData:
        """The client data a replayed update of the leakage evaluation trains on, given the
        client's data with ``train`` cut to the attacked records (default: as given)."""
        return data

    #: True: :meth:`vector_model`'s ``forward(x, y, mask)`` is the training objective of a
    #: batch (its mean over the rows where ``mask`` is 1), not the logits; the executor then
    #: leaves the clients' evaluation to :meth:`vector_result`, which receives their data
    vector_objective: bool = False

    def vector_model(self) -> nn.Module:
        """The network the vectorized executor calls functionally with each client's stacked
        parameters (default: the model spec's network), one for all of a round's clients; its
        parameter names are ``VectorJob.start``'s, and those it does not train are held
        (``requires_grad`` off)."""
        return seeded((self.seed, 0x1417), self.model_spec).to(self.device)

    def vector_keys(self, model: nn.Module) -> list[str] | None:
        """The entries of ``model``'s state that a client's result is made of (None: all)."""
        return None

    def vector_job(self, task: ClientTask) -> VectorJob:
        """One client's local work in the vectorized executor's terms."""
        raise NotImplementedError(f"{self.name} is not vectorized")

    def vector_result(
        self,
        task: ClientTask,
        weights: TensorDict,
        num_samples: int,
        metrics: dict[str, float],
        kept: TensorDict | None = None,
        data: ClientData | None = None,
    ) -> ClientResult:
        """The client's result from its trained weights, as ``local_update`` would have
        returned it; ``kept`` is the last chain's result (``VectorJob.then``). The tensors are
        the client's own copies on the algorithm's device: the upload may stay there (the
        server aggregates on the device), the engine moves the kept state to the CPU. ``data``:
        the client's data, given on evaluation rounds to an algorithm with
        :attr:`vector_objective` (which evaluates its clients itself)."""
        raise NotImplementedError(f"{self.name} is not vectorized")

    # ----------------------------------------------------------------- validation
    @classmethod
    def validate_params(cls, params: Mapping[str, Any] | None) -> AlgorithmParams:
        """Validate ``algorithm_params``; errors name ``algorithm_params.<key>``."""
        try:
            return cls.Params.model_validate(dict(params or {}))
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(["algorithm_params", *map(str, err["loc"])])
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
            raise ConfigError(key, f"{msg} (for algorithm {cls.name!r})") from None

    @classmethod
    def dp_epochs(cls, local_epochs: int, params: AlgorithmParams) -> int:
        """Epochs of DP-SGD a client runs over its records per round: what record-level
        accounting composes and what the noise is calibrated for. Default: ``local_epochs``."""
        return local_epochs

    @classmethod
    def dp_side_release(cls, params: AlgorithmParams) -> float | None:
        """Under ``privacy.protect: knowledge+model``, the noise multiplier (relative to its
        add/remove sensitivity) of what a client releases beside its model in each round it
        takes part, composed into its accountant; None for an algorithm that releases nothing
        else. Raises :class:`ConfigError` when ``params`` allow no guarantee."""
        return None

    def dp_guarantee(self) -> str:
        """What this run's ``epsilon`` guarantees (the ``dp_guarantee`` tag of its runs):

        - ``isrl``: record-level DP of each client's records against the server and the other
          clients (everything derived from the records is DP);
        - ``client-level``: a client's participation, against all but the noising server;
        - ``shared-only``: only the uploaded part's training is DP; a personal part trained
          without noise on the same records leaves the upload's sensitivity unbounded, so there
          is no formal guarantee: ``epsilon`` is inf and what the shared part's steps spent is
          reported as ``epsilon_shared``;
        - ``client-ldp``: each client's whole data, against everyone who sees what it sends
          (LoDMeta's perturbation: no trusted party);
        - ``weak-delta``: a mechanism at a delta that permits releasing a record outright
          (``PrivacySettings.weak_delta``): epsilon is inf, as for ``none``;
        - ``none``: no mechanism (epsilon is inf); ``no-release``: nothing leaves the client.
        """
        if not self.uploads:
            return "no-release"
        if self.privacy is None:
            return "none"
        if self.privacy.weak_delta:
            return "weak-delta"
        return {"dpsgd": "isrl", "client": "client-level", "perturbation": "client-ldp"}.get(
            self.privacy.mechanism, self.privacy.mechanism
        )

    def privacy_tags(self) -> dict[str, str]:
        """The tags that say what this run's ``epsilon`` means (every run is tagged with all
        of them; analysis reads them):

        - ``dp_guarantee``: always, see :meth:`dp_guarantee`;
        - ``dp_relation``: with a DP mechanism on, the neighbouring relation of the epsilon,
          ``add-remove`` (DP-SGD's Poisson record sampling, Poisson client sampling) or
          ``replace-one`` (fixed-size client sampling; the replacement-sensitivity mechanisms).
          Epsilons under different relations are not comparable;
        - ``client_sampling``: for client-level DP, ``poisson`` or ``fixed``.
        """
        tags = {"dp_guarantee": self.dp_guarantee()}
        p = self.privacy
        if p is not None and self.uploads:
            tags["dp_relation"] = p.relation
            if p.mechanism == "client":
                tags["client_sampling"] = p.client_sampling
        return tags

    # ----------------------------------------------------------------- server side
    @abstractmethod
    def init_server(self) -> None:
        """Create the server's initial state (called once, before round 1, in the main process)."""

    def init_client_state(self, client_id: int) -> Any:
        """The private state a client starts with (kept by the engine). Default: none."""
        return None

    def sample_clients(
        self, round: int, rng: np.random.Generator, fraction: float, force_all: bool
    ) -> list[int]:
        """Clients that take part in ``round`` (1-based), sorted. Default: uniform without
        replacement, ``max(1, int(fraction * N))`` of them, or all when ``force_all``.

        A DP mechanism whose guarantee depends on how clients are sampled overrides this with
        its own scheme (client-level DP: flcore.privacy.client_level, where a Poisson round may
        hold no client; the engine then runs the round without training)."""
        n = self.num_clients
        if force_all:
            return list(range(n))
        m = max(1, int(fraction * n))
        return sorted(int(i) for i in rng.choice(n, size=m, replace=False))

    def broadcast(self, round: int, client_id: int) -> TensorDict:
        """What the server sends to ``client_id`` this round. Default: nothing."""
        return {}

    def begin_round(self, round: int, client_ids: list[int]) -> None:  # noqa: B027
        """Prepare to receive this round's uploads (optional hook)."""

    @abstractmethod
    def accumulate(self, result: ClientResult) -> None:
        """Fold one client's result into the round's aggregate (called in client-id order)."""

    @abstractmethod
    def end_round(self, round: int) -> None:
        """Finish aggregation and update the server state."""

    def global_model(self) -> nn.Module | None:
        """The aggregated model evaluated on the global test set, or None if there is none."""
        return None

    def evaluate_server(
        self,
        data: Any,
        client_states: Mapping[int, Any],
        device: torch.device,
        *,
        global_test: bool = True,
    ) -> dict[str, float | None]:
        """What the engine measures after an evaluation round's aggregation, merged into the
        round's metrics (a key here replaces the clients' mean of the same key). Default:
        ``global_accuracy``, the :meth:`global_model` on the global test set (nothing when
        there is no global model, or on a round the engine's ``global_eval_every`` passes
        over: ``global_test`` False). A meta-learning algorithm adapts its meta-model on every
        client's support set instead (flcore.algorithms.meta), since a walk's round visits one
        client."""
        model = self.global_model()
        if model is None or not global_test:
            return {}
        from contextlib import nullcontext

        from flcore.algorithms.training import evaluate, static_bn, static_bn_layers

        # HeteroFL's static BN: the server queries every client's records for the statistics
        # (Diao et al. 2021, Sec. 3.2); other models skip gathering them
        stats = (
            static_bn(model, data.clients_train_set(), data.info, device=device)
            if static_bn_layers(model)
            else nullcontext()
        )
        with stats:
            acc, _ = evaluate(model, data.global_test_set(), data.info, device=device)
        return {"global_accuracy": acc}

    def comm_units(self, client_ids: list[int]) -> float | None:
        """The round's communication in the relative units of LoDMeta's Table 1 (one model
        sent once is 1), for the algorithms that report it (``comm_units``, summed over
        rounds); None: not reported (``bytes_up``/``bytes_down`` always are)."""
        return None

    def attack_surface(self, broadcast: TensorDict, client_id: int) -> Any:
        """What an honest-but-curious server can compute about ``client_id``'s upload, given
        what it ``broadcast``: a :class:`~flcore.attacks.surface.GradientSurface` built only
        from the broadcast, the public architecture and the protocol's public initial values
        of the client's private tensors. None for an algorithm that uploads nothing.

        Called on the server's instance (after ``init_server``). Every uploading algorithm
        must say how its upload relates to a gradient; the attack contract tests check it."""
        if not self.uploads:
            return None
        raise NotImplementedError(
            f"{type(self).__name__} uploads but does not define attack_surface(): gradient "
            "inversion attacks cannot simulate its upload"
        )

    def privacy_metrics(self) -> dict[str, float]:
        """The privacy spent so far. Without a DP mechanism nothing bounds what an uploading
        algorithm releases, so epsilon is inf; an algorithm that uploads nothing spends 0.
        DP mechanisms override this with their accountant's figure."""
        return {"epsilon": math.inf if self.uploads else 0.0}

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The whole server state, for checkpoints."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    # ----------------------------------------------------------------- client side
    def client_width(self, client_id: int) -> float:
        """The width client ``client_id`` trains: p_i for a capacity-aware algorithm, else the
        width of the (already narrowed) model every client shares."""
        if self.capacity is None:
            return 1.0
        if self.capacity_aware:
            return self.capacity.width(client_id)
        return self.capacity.min_width

    def cost_model(self, client_id: int) -> nn.Module:
        """A fresh copy of the network client ``client_id`` trains, for measuring its cost
        (flcore.models.cost): the model at the client's width. Algorithms that train something
        else (a decomposed or gated network) override it."""
        if self.capacity is not None and self.capacity_aware:
            return self.model_spec(width=self.client_width(client_id)).to(self.device)
        return self.model_spec().to(self.device)

    def local_optimizer(
        self,
        params: Iterable[torch.Tensor],
        *,
        lr: float | None = None,
        lr_scale: float = 1.0,
        round: int | None = None,
    ) -> torch.optim.Optimizer:
        """The configured local optimizer (name, momentum, weight decay) over ``params``, at
        ``lr`` (default: the configured one, decayed to ``round``) times ``lr_scale``; a fresh
        one each round."""
        from flcore.algorithms.training import make_optimizer

        t = self.training
        return make_optimizer(
            params,
            name=t.optimizer,
            lr=(t.lr_at(round) if lr is None else lr) * lr_scale,
            momentum=t.momentum,
            weight_decay=t.weight_decay,
        )

    def run_epochs(
        self,
        model: nn.Module,
        data: ClientData,
        optimizer: Any,
        generator: torch.Generator,
        *,
        epochs: int | None = None,
        **hooks: Any,
    ) -> float:
        """:func:`~flcore.algorithms.training.train_epochs` over the client's training records
        with the configured batch size on this algorithm's device: ``epochs`` (default: the
        configured local epochs), and any of its hooks (``loss_fn``, ``backward``, ``sampler``,
        ``max_grad_norm``). Returns the mean training loss."""
        from flcore.algorithms.training import train_epochs

        t = self.training
        return train_epochs(
            model,
            data.train,
            data.info,
            optimizer,
            epochs=t.epochs if epochs is None else epochs,
            batch_size=t.batch_size,
            generator=generator,
            device=self.device,
            **hooks,
        )

    def client_eval(
        self, task: ClientTask, model: nn.Module, data: ClientData, *, before: bool = False
    ) -> dict[str, float]:
        """On an evaluation round, ``model`` on the client's own test set; ``{}`` otherwise.

        Every ``local_update`` calls it twice: with ``before=True`` on the model the client
        starts the round with (what it received, completed by its private parts), giving
        ``accuracy_before``, and after local training, giving ``accuracy`` and ``test_loss``.
        HyperFL's authors' code measures both (their ``acc1`` and ``acc2``); for FedAvg the
        first is the global model on the client's distribution. Evaluation draws no random
        numbers and leaves training bitwise unchanged (a contract check).
        """
        if not task.evaluate:
            return {}
        from flcore.algorithms.training import evaluate, static_bn

        # a static-BN model (HeteroFL's) is evaluated with its statistics on the client's own
        # training records; nothing else changes for other models
        with static_bn(model, data.train, data.info, device=self.device):
            acc, loss = evaluate(model, data.test, data.info, device=self.device)
            out = {"accuracy_before": acc} if before else {"accuracy": acc, "test_loss": loss}
            if data.val is not None:
                val_acc, _ = evaluate(model, data.val, data.info, device=self.device)
                out["val_accuracy_before" if before else "val_accuracy"] = val_acc
        return out

    @abstractmethod
    def local_update(
        self, data: ClientData, task: ClientTask, generator: torch.Generator
    ) -> ClientResult:
        """One client's local work in one round. Runs in a worker: use only the arguments."""


ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")
