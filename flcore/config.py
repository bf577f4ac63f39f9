"""Typed, frozen experiment configs, validated at the edge.

A config is read from YAML (or a mapping), ``--set key=value`` overrides are applied with dotted
keys, and the result is validated before any training starts. Unknown keys, wrong types and
out-of-range values raise :class:`~flcore.errors.ConfigError` naming the dotted key. Objects deeper
in flcore never read this config: the builders turn it into typed keyword arguments.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from flcore.errors import ConfigError

__all__ = [
    "ExperimentConfig",
    "PartitionConfig",
    "OptimizerConfig",
    "PrivacyConfig",
    "PERTURBATION_CLIP",
    "AttackConfig",
    "CapacityConfig",
    "ClientSplitConfig",
    "EarlyStoppingConfig",
    "VALIDATION_METRICS",
    "check_early_stopping",
    "SYMBOLIC_ROUNDS",
    "resolve_round",
    "load_config",
    "apply_overrides",
    "parse_overrides",
    "validate_config",
    "flatten",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class PartitionConfig(_Strict):
    """How the training data is split over clients (see flcore.data.partition)."""

    name: str = "dominant"
    s: float = Field(20.0, ge=0, le=100, description="dominant: % of data drawn over all classes")
    beta: float = Field(0.5, gt=0, description="dirichlet: concentration")
    k: int = Field(2, ge=1, description="pathological: classes per client")


class OptimizerConfig(_Strict):
    """The clients' local optimizer."""

    name: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(0.5, ge=0, lt=1)
    weight_decay: float = Field(5e-4, ge=0)


#: LoDMeta's clip M where a ``perturbation`` config gives none (issue 26 section 4): the median
#: L2 norm of the clean meta-gradient over the first 100 steps of the FMNIST default, 0.627
#: (benchmarks/lodmeta_grad_norms.py; BENCHMARKS.md "The clip M from measured meta-gradient
#: norms"), rounded down. The paper's M_meta is a smoothness constant with no value: there is
#: no paper's M to copy. The other mechanisms keep DP-SGD's 0.04.
PERTURBATION_CLIP = 0.6


class PrivacyConfig(_Strict):
    """Differential privacy of an experiment. Give ``noise_multiplier`` or ``target_epsilon``.

    ``mechanism``: ``dpsgd`` (record-level DP-SGD at each client, ISRL-DP), ``client``
    (client-level DP), ``gaussian`` (a noised bounded statistic, FedHKD) or ``perturbation``
    (clipped-update perturbation, LoDMeta); each algorithm says which it supports. The record
    sampling rate of DP-SGD is ``batch_size / n_i``; the config's ``client_fraction`` is the
    sampling rate of client-level DP.

    ``client_sampling`` (client-level DP only; ignored by the other mechanisms): ``poisson``
    (default, McMahan et al. 2018) samples each client with probability ``client_fraction``
    and is accounted under add/remove; ``fixed`` samples ``max(1, int(client_fraction N))``
    clients without replacement and is accounted under replace-one, by the ``rdp`` accountant
    only (flcore.privacy.client_level).

    ``protect``: ``model`` (default) or ``knowledge+model``, for an algorithm that releases
    class statistics beside its model (FedHKD): DP-SGD on local training, and the statistics
    released as noised per-class sums and counts (noise ``algorithm_params.sigma``), every
    release composed per client under add/remove (flcore.algorithms.fedhkd).
    """

    mechanism: Literal["dpsgd", "client", "gaussian", "perturbation"] = "dpsgd"
    noise_multiplier: float | None = Field(None, ge=0)
    target_epsilon: float | None = Field(None, gt=0)
    release_epsilon: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="perturbation: the paper's per-release epsilon (LoDMeta Algorithm 2: "
        "sigma^2 = 8 M^2 ln(1.25/delta) / epsilon^2, the classic formula, epsilon < 1); the "
        "run's epsilon is still composed by the accountant",
    )
    delta: float = Field(1e-5, gt=0, lt=1)
    clip: float = Field(
        0.04,
        gt=0,
        description="per-sample (dpsgd) or per-update (client, perturbation) L2 norm; "
        f"perturbation's default is {PERTURBATION_CLIP} (measured meta-gradient norms)",
    )
    accountant: Literal["rdp", "prv", "pld"] = "rdp"
    max_noise_multiplier: float = Field(
        1000.0,
        gt=0,
        description="calibration gives up above this sigma (a target that needs more fails the "
        "config); high enough that every corner of the shipped search spaces is met",
    )
    client_sampling: Literal["poisson", "fixed"] = Field(
        "poisson",
        description="client-level DP: poisson (q = client_fraction, add/remove) or fixed "
        "(m clients without replacement, replace-one, rdp only)",
    )
    protect: Literal["model", "knowledge+model"] = Field(
        "model",
        description="knowledge+model: also noise the class statistics an algorithm releases "
        "beside its model (FedHKD), composed with DP-SGD under add/remove",
    )

    @model_validator(mode="before")
    @classmethod
    def _perturbation_clip(cls, data: Any) -> Any:
        """A ``perturbation`` config without a clip gets :data:`PERTURBATION_CLIP`."""
        perturbation = isinstance(data, Mapping) and data.get("mechanism") == "perturbation"
        return {**data, "clip": PERTURBATION_CLIP} if perturbation and "clip" not in data else data

    @model_validator(mode="after")
    def _one_of(self) -> PrivacyConfig:
        given = [self.noise_multiplier, self.target_epsilon, self.release_epsilon]
        if sum(v is not None for v in given) != 1:
            raise ValueError(
                "give exactly one of noise_multiplier, target_epsilon and release_epsilon"
            )
        if self.release_epsilon is not None and self.mechanism != "perturbation":
            raise ValueError("release_epsilon is the perturbation mechanism's (LoDMeta) setting")
        if self.mechanism == "perturbation" and not self.delta < 0.5:
            raise ValueError(f"perturbation (LoDMeta) needs delta in (0, 1/2), got {self.delta}")
        return self


class CapacityConfig(_Strict):
    """Clients' capacity ratios r_i (the share of the full model's size each can train) and the
    width rule (flcore.capacity): a client trains width p_i, the largest multiple of ``p_min``
    with p_i^2 <= r_i.

    - ``ideal``: every r_i = 1;
    - ``uniform``: r_i ~ U[low, high], seeded by the experiment seed (Pa3dFL's Hetero:
      low 0.01, high 1.0);
    - ``fixed``: the given ``ratios``, one per client.
    """

    name: Literal["ideal", "uniform", "fixed"] = "ideal"
    low: float = Field(0.01, gt=0, le=1, description="uniform: smallest capacity ratio")
    high: float = Field(1.0, gt=0, le=1, description="uniform: largest capacity ratio")
    ratios: list[float] | None = Field(None, description="fixed: one ratio in (0, 1] per client")
    p_min: float = Field(1 / 16, gt=0, le=1, description="width step: widths are multiples of it")

    @model_validator(mode="after")
    def _ranges(self) -> CapacityConfig:
        floor = self.p_min**2
        if self.name == "uniform":
            if self.high < self.low:
                raise ValueError(f"high ({self.high}) < low ({self.low})")
            if self.low < floor:
                raise ValueError(
                    f"low {self.low} is below p_min^2 = {floor:.6g}: such a client could not "
                    "train even the narrowest (p_min-width) model"
                )
        if self.name == "fixed":
            if not self.ratios:
                raise ValueError("fixed capacity needs ratios: one per client")
            bad = [r for r in self.ratios if not floor <= r <= 1]
            if bad:
                raise ValueError(
                    f"ratio {bad[0]} is not in [p_min^2, 1] = [{floor:.6g}, 1]: a client below "
                    "p_min^2 could not train even the narrowest model"
                )
        elif self.ratios is not None:
            raise ValueError(f"ratios is for name: fixed, not {self.name!r}")
        return self


class ClientSplitConfig(_Strict):
    """Split each client's own records into train / validation / test (fractions summing to
    1). Without it a client's test set is drawn from the dataset's test split with its train
    label distribution and it has no validation set."""

    train: float = Field(gt=0, le=1)
    val: float = Field(0.0, ge=0, lt=1)
    test: float = Field(gt=0, lt=1)

    @model_validator(mode="after")
    def _sum(self) -> ClientSplitConfig:
        total = self.train + self.val + self.test
        if abs(total - 1) > 1e-9:
            raise ValueError(f"train + val + test must be 1, got {total:g}")
        return self


class GraphConfig(_Strict):
    """The communication graph of a decentralized algorithm (flcore.algorithms.meta.graph):
    LoDMeta's walk moves along its edges, L2C's clients gossip with their neighbours.

    ``name``: ``watts_strogatz`` (small world: a ring where each node joins its ``k`` nearest
    neighbours, each edge rewired with probability ``p``; a connected draw is required),
    ``regular`` (a random ``degree``-regular graph, the paper's 3-regular expander) or ``edges``
    (the edge list in ``path``: two client ids a line, ``#`` comments). ``walk``: the random
    walk's transition matrix, ``simple`` (a uniform neighbour) or ``metropolis``
    (Metropolis-Hastings: a uniform stationary distribution on any graph). A disconnected graph
    is an error.
    """

    name: Literal["watts_strogatz", "regular", "edges"] = "regular"
    k: int = Field(4, ge=2, description="watts_strogatz: ring neighbours each node joins")
    p: float = Field(0.3, ge=0, le=1, description="watts_strogatz: rewiring probability")
    degree: int = Field(3, ge=1, description="regular: each client's neighbours")
    path: str | None = Field(None, description="edges: the edge-list file")
    walk: Literal["simple", "metropolis"] = "simple"

    @model_validator(mode="after")
    def _even_ring(self) -> GraphConfig:
        # networkx joins k // 2 neighbours on each side: an odd k would silently be k - 1
        if self.name == "watts_strogatz" and self.k % 2:
            raise ValueError(
                f"graph.k must be even for watts_strogatz (k // 2 a side), got {self.k}"
            )
        return self


class FewShotConfig(_Strict):
    """Few-shot clients (flcore.data.fewshot): each training client holds one N-way K-shot task
    from the meta-training classes (``k_shot`` support, ``query`` query and ``test_query``
    held-out records a class); ``unseen_clients`` more draw theirs from the meta-testing
    classes and only adapt. ``train_classes`` / ``unseen_classes``: labels of the dataset
    (default on FMNIST: 0-4 and 5-9; a few-shot dataset brings its own split)."""

    n_way: int = Field(5, ge=2)
    k_shot: int = Field(5, ge=1)
    query: int = Field(15, ge=1)
    test_query: int = Field(15, ge=1)
    train_classes: list[int] | None = None
    unseen_classes: list[int] | None = None
    unseen_clients: int = Field(10, ge=0)


class EarlyStoppingConfig(_Strict):
    """Stop when ``metric`` (a validation metric, higher is better) has not improved for
    ``patience`` x rounds rounds (Pa3dFL: 0.2 R); the run then reports the metrics of its
    best-validation round, or with ``window`` W > 1 of its best W evaluation rounds in a row
    (their means: a round's few sampled clients make its value noisy, flcore.engine)."""

    metric: str = "val_accuracy"
    patience: float = Field(0.2, gt=0, le=1, description="fraction of the run's rounds")
    window: int = Field(
        1,
        ge=1,
        description="evaluation rounds the tracked value averages; the run then reports its "
        "best window's mean accuracies (flcore.engine)",
    )
    report: Literal["window", "all_clients"] = Field(
        "window",
        description="what the run reports as its best-validation model's accuracies: the best "
        "window's means over the clients each round sampled (window), or every client measured "
        "once on the state the best window ended with (all_clients: the engine keeps that "
        "state, in memory and in checkpoints, and measures it when the run ends)",
    )


#: the symbolic attacked rounds, resolved per run against its ``rounds`` (see
#: :meth:`AttackConfig.resolved_rounds`)
SYMBOLIC_ROUNDS = ("first", "middle", "last")


def resolve_round(entry: int | str, rounds: int) -> int:
    """One ``attack.rounds`` entry as a round number of a run of ``rounds`` rounds: ``first``
    is 1, ``last`` is ``rounds``, ``middle`` is ``(rounds + 1) // 2`` (the upper middle of an
    even count's lower half: 2 of 3, 100 of 200, 1 of 1); an int is itself."""
    if entry == "first":
        return 1
    if entry == "last":
        return rounds
    if entry == "middle":
        return (rounds + 1) // 2
    return int(entry)


class AttackConfig(_Strict):
    """A privacy evaluation of the run's uploads (flcore.attacks.evaluation): HyperFL's
    protocol by default, IG on 10 records of client 0, one record and one local step per
    replayed upload, labels given, in the last round (a sweep's default: first, middle, last).

    ``rounds`` holds round numbers and the names ``first``, ``middle`` and ``last``, resolved
    per run against its own ``rounds`` (so a schedule survives a searched ``rounds``).
    ``identify_k`` is K of ``leak_identified``: how many other records of the same class each
    reconstruction must be closer to its own record than."""

    name: str = "ig"
    rounds: list[int | str] | None = Field(
        None, description="attacked rounds (numbers, first, middle, last); None: the last one"
    )
    clients: list[int] = Field(default_factory=lambda: [0], min_length=1)
    images: int = Field(10, ge=1, description="records attacked per (round, client)")
    iterations: int | None = Field(None, ge=1, description="None: the attack's default")
    local_steps: int = Field(1, ge=1, description="local steps of each replayed update")
    batch: int = Field(1, ge=1, description="records per replayed upload (the paper: 1)")
    labels: Literal["auto", "given"] = Field(
        "given",
        description="given: the attacker knows the labels (the paper's protocol, the worst "
        "case); auto: recovered (iDLG) where the upload allows it, else given",
    )
    identify_k: int = Field(
        20, ge=1, description="leak_identified: same-class decoys per attacked record"
    )
    known: Literal["none", "rest"] = Field(
        "none",
        description="none: each replayed upload is the client's step on the attacked records "
        "alone; rest: the client's real step, the attacker knowing every record of it but the "
        "attacked ones (differential privacy's adversary; the walk's meta step)",
    )
    seed: int = Field(0, ge=0)
    params: dict[str, Any] = Field(
        default_factory=dict, description="the attack's own knobs (e.g. tv, lr, signed)"
    )

    @field_validator("rounds", mode="before")
    @classmethod
    def _rounds(cls, v: Any) -> Any:
        # Checked by hand: pydantic's union errors would name ``rounds.0.int`` and coerce
        # ``true`` to round 1.
        if v is None:
            return v
        if not isinstance(v, list | tuple) or not v:
            raise ValueError(
                f"must be a non-empty list of round numbers or {', '.join(SYMBOLIC_ROUNDS)}, "
                f"got {v!r}"
            )
        for entry in v:
            ok_int = isinstance(entry, int) and not isinstance(entry, bool) and entry >= 1
            if not ok_int and entry not in SYMBOLIC_ROUNDS:
                raise ValueError(
                    f"{entry!r} is not a round: give numbers >= 1 or {', '.join(SYMBOLIC_ROUNDS)}"
                )
        return list(v)

    def resolved_rounds(self, rounds: int) -> tuple[int, ...]:
        """The attacked round numbers of a run of ``rounds`` rounds, sorted, each once (None:
        the last round)."""
        entries = self.rounds if self.rounds is not None else ["last"]
        return tuple(sorted({resolve_round(e, rounds) for e in entries}))


class KnowledgeAttackConfig(AttackConfig):
    """The knowledge inversion of released class representations (FedHKD, FedProto;
    flcore.attacks.knowledge_inversion): at each of ``rounds``, each of ``clients``' real update
    is replayed and every class it shares is inverted into an image, scored against the client's
    class mean image with the population's class mean image as the no-information baseline
    (``knowledge_psnr_gain``, ``knowledge_ssim_gain``). ``images``, ``batch``, ``local_steps``,
    ``labels`` and ``identify_k`` do not apply. A run may carry it beside ``attack``."""

    name: str = "knowledge_inversion"


class ExperimentConfig(_Strict):
    """One FL experiment. Defaults are HyperFL's Fashion-MNIST setup (appendix D.1)."""

    experiment: str | None = None
    algorithm: str = "fedavg"
    dataset: str = "fmnist"
    data_root: str | None = None
    model: str | None = Field(None, description="model name; None: the dataset's default")
    model_params: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the model (checked by name)"
    )
    num_clients: int = Field(20, ge=1)
    samples_per_client: int | None = Field(600, ge=1)
    test_samples_per_client: int | None = Field(None, ge=1)
    global_test_per_class: int | None = Field(
        None, ge=1, description="cap on the global test set's records per class; None: all"
    )
    public_samples: int | None = Field(
        None,
        ge=1,
        description="a public set of this many training records no client holds (FedMD's; "
        "FedHKD: one local train set); None: no public set",
    )
    rounds: int = Field(200, ge=1)
    local_epochs: int = Field(5, ge=1)
    batch_size: int = Field(50, ge=1)
    lr: float = Field(0.01, gt=0)
    lr_decay: float = Field(
        1.0,
        gt=0,
        le=1,
        description="local lr of round t is lr x lr_decay^floor((t-1) / lr_decay_every) "
        "(Pa3dFL: 0.998 every round; FedHKD: 0.5 every 10 rounds)",
    )
    lr_decay_every: int = Field(1, ge=1, description="rounds between two lr_decay steps")
    client_fraction: float = Field(1.0, gt=0, le=1)
    full_last_round: bool = True
    eval_every: int = Field(1, ge=1)
    global_eval_every: int | None = Field(
        None,
        ge=1,
        description="of the evaluation rounds, those that also measure the global model on the "
        "global test set (global_accuracy): rounds divisible by it, and the last; None: every "
        "evaluation round. Training is the same either way; a 10,000-record test set costs "
        "about 4 s a round on 2 CPU cores. Meta-learning's server evaluation is unaffected",
    )
    seed: int = Field(0, ge=0)
    device: str = "cpu"
    workers: int | None = Field(None, ge=1, description="client processes; None: CPUs available")
    executor: Literal["auto", "loop", "vectorized"] = Field(
        "auto",
        description="how a round's clients train: 'loop' one after another (in process or a "
        "pool of workers), 'vectorized' as one batched computation (FedAvg, FedProx, "
        "Local-only, Ditto, DP-FedAvg), 'auto' vectorized on CUDA where allowed, else the loop",
    )
    executor_chunk: int | None = Field(
        None, ge=1, description="clients per batched computation (vectorized); None: a round"
    )
    gpu_memory_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="cap on this run's share of its GPU's memory (PyTorch's caching allocator "
        "only: the CUDA context and other libraries are not counted); a trial that asks Ray for "
        "a fraction of a GPU gets it here, since Ray's fractions cap nothing",
    )
    partition: PartitionConfig = PartitionConfig()
    client_split: ClientSplitConfig | None = None
    capacity: CapacityConfig | None = None
    early_stopping: EarlyStoppingConfig | None = None
    optimizer: OptimizerConfig = OptimizerConfig()
    algorithm_params: dict[str, Any] = Field(default_factory=dict)
    privacy: PrivacyConfig | None = None
    graph: GraphConfig | None = Field(
        None, description="the communication graph of a decentralized algorithm (LoDMeta, L2C)"
    )
    fewshot: FewShotConfig | None = Field(
        None, description="few-shot clients (meta-learning algorithms): one task a client"
    )
    attack: AttackConfig | None = None
    knowledge_attack: KnowledgeAttackConfig | None = None
    output_dir: str = "runs"
    checkpoint_every: int = Field(0, ge=0, description="rounds between checkpoints; 0: never")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v != "cpu" and not v.startswith(("cuda", "mps")):
            raise ValueError(f"must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {v!r}")
        return v

    def resolved_workers(self) -> int:
        """Worker processes to use: the config's, else the CPUs this process may use."""
        if self.workers is not None:
            return self.workers
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # pragma: no cover - non-Linux
            return max(1, os.cpu_count() or 1)


def _error_key(loc: Iterable[Any]) -> str:
    return ".".join(str(p) for p in loc)


def validate_config(raw: Mapping[str, Any]) -> ExperimentConfig:
    """Validate a mapping into an :class:`ExperimentConfig`, checking registered names too.

    Raises:
        ConfigError: naming the first offending dotted key.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError("", f"a config must be a mapping, got {type(raw).__name__}")
    try:
        cfg = ExperimentConfig.model_validate(dict(raw))
    except ValidationError as exc:
        err = exc.errors()[0]
        key = _error_key(err["loc"])
        if err["type"] == "extra_forbidden":
            raise ConfigError(key, "unknown key") from None
        raise ConfigError(key, f"{err['msg']} (got {err.get('input')!r})") from None
    _check_names(cfg)
    return cfg


def _check_names(cfg: ExperimentConfig) -> None:
    # Imported here: the registries fill as their modules import, and config must stay light.
    from flcore.algorithms import ALGORITHMS
    from flcore.data import DATASET_INFO, PARTITIONERS
    from flcore.models import MODELS

    if cfg.algorithm not in ALGORITHMS:
        raise ConfigError(
            "algorithm",
            f"unknown algorithm {cfg.algorithm!r}; known: {', '.join(ALGORITHMS.names())}",
        )
    from flcore.data.metasets import METASETS

    fewshot_only = cfg.dataset in METASETS
    if cfg.dataset not in DATASET_INFO and not fewshot_only:
        known = sorted(DATASET_INFO) + [f"{n} (few-shot)" for n in METASETS.names()]
        raise ConfigError("dataset", f"unknown dataset {cfg.dataset!r}; known: {', '.join(known)}")
    if fewshot_only and cfg.fewshot is None:
        raise ConfigError(
            "dataset", f"{cfg.dataset} is a few-shot dataset: it needs a fewshot mapping"
        )
    if cfg.partition.name not in PARTITIONERS:
        raise ConfigError(
            "partition.name",
            f"unknown partitioner {cfg.partition.name!r}; known: {', '.join(PARTITIONERS.names())}",
        )
    if cfg.model is not None and cfg.model not in MODELS:
        raise ConfigError(
            "model", f"unknown model {cfg.model!r}; known: {', '.join(MODELS.names())}"
        )
    if cfg.model_params:
        import inspect

        name = cfg.model or ("conv4" if fewshot_only else DATASET_INFO[cfg.dataset].model)
        accepted = set(inspect.signature(MODELS.get(name)).parameters) - {
            "num_classes",
            "in_channels",
        }
        for key in cfg.model_params:
            if key not in accepted:
                raise ConfigError(
                    f"model_params.{key}",
                    f"unknown key for model {name!r}; known: {', '.join(sorted(accepted))}",
                )
    if cfg.partition.name == "pathological" and not fewshot_only:
        n_cls = DATASET_INFO[cfg.dataset].num_classes
        if cfg.partition.k > n_cls:
            raise ConfigError("partition.k", f"must be <= {n_cls} classes of {cfg.dataset}")
    if cfg.capacity is not None:
        _check_capacity(cfg, cfg.capacity)
    check_early_stopping(cfg)
    alg = ALGORITHMS.get(cfg.algorithm)
    alg.validate_params(cfg.algorithm_params)
    if _static_bn_model(cfg) and not alg.static_bn_ok:
        raise ConfigError(
            "model",
            f"{cfg.algorithm} cannot run {cfg.model!r}: it rebuilds or gates the network's "
            "layers and has no rule for BatchNorm; use the model without the _sbn suffix",
        )
    if cfg.privacy is not None and cfg.privacy.mechanism not in alg.privacy_mechanisms:
        supported = ", ".join(sorted(alg.privacy_mechanisms)) or "none"
        raise ConfigError(
            "privacy.mechanism",
            f"{cfg.algorithm} cannot run with {cfg.privacy.mechanism!r} (supported: {supported})",
        )
    _check_topology(cfg, alg)
    p = cfg.privacy
    if p is not None:
        _check_protect(cfg, p, alg)
    fixed_size = p is not None and p.mechanism == "client" and p.client_sampling == "fixed"
    if fixed_size and p is not None and p.accountant != "rdp":
        raise ConfigError(
            "privacy.accountant",
            f"{p.accountant!r} cannot account fixed-size client sampling (replace-one "
            "relation): use accountant rdp, or client_sampling poisson",
        )
    if cfg.attack is not None:
        _check_attack(cfg, cfg.attack)
    if cfg.knowledge_attack is not None:
        _check_attack(cfg, cfg.knowledge_attack, "knowledge_attack")
    if alg.requires_public and cfg.public_samples is None:
        raise ConfigError(
            "public_samples",
            f"{cfg.algorithm} distils on a public set: set public_samples (FedHKD: one local "
            "train set, e.g. 450 for 600 records split 75/25)",
        )
    if alg.requires_privacy and cfg.privacy is None:
        raise ConfigError(
            "privacy",
            f"{cfg.algorithm} needs a privacy mapping, e.g. "
            f"{{mechanism: {alg.requires_privacy}, target_epsilon: 4, delta: 1e-5, "
            f"clip: 0.04{', protect: knowledge+model' if alg.side_releases else ''}}}",
        )


def _check_topology(cfg: ExperimentConfig, alg: Any) -> None:
    """A decentralized algorithm has its graph and few-shot clients; a walk moves one client a
    step, so the server's client sampling keys mean nothing there and are refused."""
    if alg.topology in ("walk", "gossip") and cfg.graph is None:
        raise ConfigError(
            "graph",
            f"{cfg.algorithm} is decentralized: give its communication graph, e.g. "
            "{name: regular, degree: 3} or {name: watts_strogatz, k: 4, p: 0.3}",
        )
    if alg.topology == "server" and cfg.graph is not None:
        raise ConfigError("graph", f"{cfg.algorithm} has a server; it takes no graph")
    if alg.topology == "walk":
        for key in ("client_fraction", "full_last_round"):
            if key in cfg.model_fields_set:
                raise ConfigError(
                    key,
                    f"{cfg.algorithm} walks a graph: each step activates the one client the "
                    "walk reaches (rounds count steps); remove this key",
                )
    if alg.needs_fewshot and cfg.fewshot is None:
        raise ConfigError(
            "fewshot",
            f"{cfg.algorithm} meta-learns over few-shot clients: give fewshot: {{n_way: 5, "
            "k_shot: 5}} (flcore.data.fewshot)",
        )
    if not alg.needs_fewshot and cfg.fewshot is not None:
        raise ConfigError(
            "fewshot", f"{cfg.algorithm} is not a meta-learning algorithm; remove fewshot"
        )
    g = cfg.graph
    if g is not None:
        from flcore.algorithms.meta.graph import check_graph

        check_graph(
            g.name, cfg.num_clients, seed=cfg.seed, k=g.k, p=g.p, degree=g.degree, path=g.path
        )


def _check_protect(cfg: ExperimentConfig, p: PrivacyConfig, alg: Any) -> None:
    """``privacy.protect`` fits the algorithm: ``knowledge+model`` exactly for an algorithm
    that releases class statistics beside its model, with DP-SGD; it checks its own params."""
    if p.protect == "knowledge+model":
        if not alg.side_releases:
            raise ConfigError(
                "privacy.protect",
                f"{cfg.algorithm} releases nothing beside its model: knowledge+model is for "
                "algorithms that also release class statistics (fedhkd, fedhkd_star)",
            )
        if p.mechanism != "dpsgd":
            raise ConfigError(
                "privacy.mechanism",
                f"protect knowledge+model runs DP-SGD on local training, got {p.mechanism!r}",
            )
        alg.dp_side_release(alg.validate_params(cfg.algorithm_params))
    elif alg.side_releases:
        raise ConfigError(
            "privacy.protect",
            f"{cfg.algorithm} releases class statistics beside its model; protecting the model "
            "alone would leave them (and their counts) outside the guarantee: set "
            "privacy.protect: knowledge+model",
        )


#: what early stopping may watch: the clients' mean validation accuracy after local training, or
#: of the model they start the round with
VALIDATION_METRICS = ("val_accuracy", "val_accuracy_before")


def check_early_stopping(cfg: ExperimentConfig) -> None:
    """Refuse ``cfg.early_stopping`` where the run would have nothing to stop on: it needs the
    clients' validation records (``client_split`` with ``val > 0``) and a validation metric;
    ``report: all_clients`` needs an algorithm whose clients measure themselves (a server-based
    one, not the meta family's server evaluation nor a walk).

    Raises:
        ConfigError: naming ``early_stopping`` (or ``early_stopping.metric``,
        ``early_stopping.report``).
    """
    es = cfg.early_stopping
    if es is None:
        return
    if es.metric not in VALIDATION_METRICS:
        raise ConfigError(
            "early_stopping.metric",
            f"must be a validation metric ({', '.join(VALIDATION_METRICS)}), got {es.metric!r}",
        )
    if cfg.client_split is None or cfg.client_split.val <= 0:
        raise ConfigError(
            "early_stopping",
            "needs validation records: set client_split with val > 0 "
            "(e.g. {train: 0.8, val: 0.1, test: 0.1}), or remove early_stopping",
        )
    if es.report == "all_clients":
        from flcore.algorithms import ALGORITHMS

        alg = ALGORITHMS.get(cfg.algorithm) if cfg.algorithm in ALGORITHMS else None
        if alg is not None and (alg.topology != "server" or not alg.client_evaluation):
            how = (
                "its server measures every client already"
                if alg.topology == "server"
                else f"its clients are visited by a {alg.topology}, not a round"
            )
            raise ConfigError(
                "early_stopping.report",
                f"all_clients runs each client's evaluated local update once more; "
                f"{cfg.algorithm} has none ({how}): use report: window",
            )


def _check_capacity(cfg: ExperimentConfig, c: CapacityConfig) -> None:
    from flcore.capacity import check_model_widths
    from flcore.data import DATASET_INFO
    from flcore.models import MODELS
    from flcore.models.scalable import ScalableModel

    name = cfg.model or DATASET_INFO[cfg.dataset].model
    model_cls = MODELS.get(name)
    if not (isinstance(model_cls, type) and issubclass(model_cls, ScalableModel)):
        scalable = [
            n
            for n in MODELS.names()
            if isinstance(MODELS.get(n), type) and issubclass(MODELS.get(n), ScalableModel)
        ]
        raise ConfigError(
            "model",
            f"capacity needs a width-scalable model ({', '.join(scalable)}), got {name!r}",
        )
    if "width" in cfg.model_params:
        raise ConfigError("model_params.width", "is set by capacity: remove it")
    if c.name == "fixed" and c.ratios is not None and len(c.ratios) != cfg.num_clients:
        raise ConfigError(
            "capacity.ratios",
            f"needs one ratio per client ({cfg.num_clients}), got {len(c.ratios)}",
        )
    check_model_widths(model_cls.FULL_CHANNELS, c.p_min)


def _static_bn_model(cfg: ExperimentConfig) -> bool:
    """The configured model normalises with static BatchNorm (``ScalableModel.STATIC_BN``)."""
    from flcore.models import MODELS

    return bool(
        cfg.model and cfg.model in MODELS and getattr(MODELS.get(cfg.model), "STATIC_BN", False)
    )


def _check_attack(cfg: ExperimentConfig, a: AttackConfig, key: str = "attack") -> None:
    from flcore.attacks import ATTACKS

    if a.name not in ATTACKS:
        raise ConfigError(
            f"{key}.name", f"unknown attack {a.name!r}; known: {', '.join(ATTACKS.names())}"
        )
    from flcore.algorithms import ALGORITHMS

    alg = ALGORITHMS.get(cfg.algorithm)
    if key == "attack" and not alg.attackable:
        raise ConfigError(
            key,
            alg.attack_refusal
            or f"no gradient-inversion surface simulates {cfg.algorithm}'s upload yet: it cannot "
            "be attacked (of the meta-learners, the random walk's lodmeta, lodmeta_basic and "
            "lodmeta_sgd can, and fedmaml and fedalt)",
        )
    if a.known == "rest" and (key != "attack" or not alg.attack_knows_rest):
        raise ConfigError(
            f"{key}.known",
            f"{cfg.algorithm}'s attack surface cannot take the client's other records (only "
            "an update made of full-batch steps on the client's whole set can: lodmeta, "
            "lodmeta_basic, lodmeta_sgd, fedmaml, fedalt); use known: none",
        )
    if _static_bn_model(cfg):
        raise ConfigError(
            key,
            f"model {cfg.model!r} normalises each batch with its own statistics (static BN), "
            "and the leakage evaluation replays records one at a time, which have none: attack "
            "the same network without BN (drop the _sbn suffix)",
        )
    supported = ATTACKS.get(a.name).algorithms
    if supported is not None and cfg.algorithm not in supported:
        raise ConfigError(
            f"{key}.name",
            f"{a.name} attacks {', '.join(sorted(supported))} uploads, not {cfg.algorithm!r}",
        )
    for entry in a.rounds or []:
        r = resolve_round(entry, cfg.rounds)
        if not 1 <= r <= cfg.rounds:
            raise ConfigError(f"{key}.rounds", f"round {r} is not in 1..{cfg.rounds}")
    for c in a.clients:
        if not 0 <= c < cfg.num_clients:
            raise ConfigError(f"{key}.clients", f"client {c} is not in 0..{cfg.num_clients - 1}")
    if a.images % a.batch:
        raise ConfigError(f"{key}.images", f"must be a multiple of {key}.batch ({a.batch})")
    if cfg.samples_per_client is not None and a.batch > cfg.samples_per_client:
        raise ConfigError(f"{key}.batch", f"a client has only {cfg.samples_per_client} records")
    params = dict(a.params) | ({"iterations": a.iterations} if a.iterations else {})
    ATTACKS.get(a.name).validate(params)


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings; values are read as YAML (``1`` int, ``0.1`` float, ``[a]``)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(item, "an override must look like key=value")
        try:
            out[key] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(key, f"cannot parse value {value!r}: {exc}") from None
    return out


def apply_overrides(raw: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ``raw`` with dotted-key overrides applied (``optimizer.momentum=0.9``)."""
    out: dict[str, Any] = copy.deepcopy(dict(raw))
    for dotted, value in overrides.items():
        node = out
        parts = dotted.split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(
                    ".".join(parts[: i + 1]), "is not a mapping; cannot set a sub-key"
                )
            node = child
        node[parts[-1]] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with errors that name the file."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError("", f"{p} is a folder, not a config file")
    if not p.is_file():
        raise ConfigError("", f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{p}: not valid YAML: {exc}") from None
    if data is None:
        # an empty file is a mistake, not "every default": that would start a full run
        raise ConfigError("", f"{p}: the file is empty (write the keys you mean, as a mapping)")
    if not isinstance(data, dict):
        raise ConfigError("", f"{p}: the top level must be a mapping")
    return data


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> ExperimentConfig:
    """Read YAML (or start from defaults when ``path`` is None), apply overrides, validate."""
    raw = read_yaml(path) if path is not None else {}
    return validate_config(apply_overrides(raw, parse_overrides(overrides)))


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings with '.': ``{"optimizer": {"momentum": .5}}`` gives
    ``optimizer.momentum``."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out
