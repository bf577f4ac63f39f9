"""Build an engine from a validated config: the one place where config becomes typed arguments."""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from flcore.algorithms import ALGORITHMS, LocalTraining, ModelSpec
from flcore.callbacks import Callback
from flcore.capacity import Capacity, make_capacity
from flcore.config import ExperimentConfig, check_early_stopping
from flcore.data import FederatedData, build_federated_data, load_dataset
from flcore.data.datasets import ArrayDataset, DatasetSplits
from flcore.data.fewshot import FewShotData, FewShotSpec, build_fewshot_data
from flcore.engine import Engine
from flcore.errors import ConfigError
from flcore.executor import AlgorithmFactory
from flcore.privacy.accounting import calibrate_history
from flcore.privacy.mechanisms import classic_gaussian_multiplier
from flcore.privacy.settings import PrivacySettings

__all__ = [
    "attack_probe",
    "build_capacity",
    "build_data",
    "build_fewshot",
    "build_graph_of",
    "build_engine",
    "check_early_stopping",
    "resolve_privacy",
]


def resolve_privacy(cfg: ExperimentConfig, data: FederatedData) -> PrivacySettings | None:
    """The noise multiplier for ``cfg.privacy``: as given, or calibrated for its target epsilon
    over the whole run before any training (a target that cannot be met is an error now).

    DP-SGD is calibrated for the worst client: the highest record sampling rate (smallest
    client) and the most steps (largest client: ``Algorithm.dp_epochs`` epochs of
    ``ceil(n_i / B)`` steps), in every round. Client-level DP composes ``rounds`` releases
    with the events its sampling scheme is accounted with (flcore.privacy.client_level):
    Poisson at ``q = fraction`` (add/remove), or fixed-size ``max(1, int(fraction N))`` of
    ``N`` (replace-one); the last at ``q = 1`` when it is forced full.
    """
    p = cfg.privacy
    if p is None:
        return None
    sigma = p.noise_multiplier
    fixed: list[tuple[float, float, int]] = []
    if p.release_epsilon is not None:  # LoDMeta's per-release setting, the classic formula
        sigma = classic_gaussian_multiplier(p.release_epsilon, p.delta)
    elif sigma is None:
        assert p.target_epsilon is not None
        if p.mechanism == "dpsgd":
            sizes = data.train.sizes
            q = min(1.0, cfg.batch_size / min(sizes))
            alg = ALGORITHMS.get(cfg.algorithm)
            epochs = alg.dp_epochs(cfg.local_epochs, alg.validate_params(cfg.algorithm_params))
            steps = cfg.rounds * epochs * math.ceil(max(sizes) / cfg.batch_size)
            schedule = [(q, steps)]
            if p.protect == "knowledge+model":  # one side release a round, at its own noise
                side = alg.dp_side_release(alg.validate_params(cfg.algorithm_params))
                fixed = [(side, 1.0, cfg.rounds)] if side is not None else []
        elif p.mechanism in ("gaussian", "perturbation"):
            schedule = [(1.0, cfg.rounds)]  # at most one release per client and round
        else:
            n = cfg.num_clients
            if p.client_sampling == "fixed":
                q = max(1, int(cfg.client_fraction * n)) / n
            else:
                q = cfg.client_fraction
            full_last = cfg.full_last_round and q < 1
            schedule = [(q, cfg.rounds - int(full_last))] + ([(1.0, 1)] if full_last else [])
            schedule = [(a, b) for a, b in schedule if b > 0]
        fixed_size = p.mechanism == "client" and p.client_sampling == "fixed"
        sigma = calibrate_history(
            p.target_epsilon,
            p.delta,
            schedule,
            accountant=p.accountant,
            max_noise_multiplier=p.max_noise_multiplier,
            sampling="fixed" if fixed_size else "poisson",
            population=cfg.num_clients if fixed_size else None,
            fixed=fixed,
        )
    units = _protected_units(cfg, data)
    weak = p.delta >= 1.0 / units
    if weak:
        warnings.warn(
            f"privacy.delta {p.delta:g} >= 1/{units} (the units one party protects: "
            f"{'clients' if p.mechanism == 'client' else 'records a client trains on'}) permits "
            "releasing one of them outright: the run is tagged dp_guarantee weak-delta and "
            "stands at epsilon = inf on every front",
            UserWarning,
            stacklevel=2,
        )
    return PrivacySettings(
        p.mechanism,
        float(sigma),
        p.clip,
        p.delta,
        p.accountant,
        p.target_epsilon,
        client_sampling=p.client_sampling,
        protect=p.protect,
        weak_delta=weak,
    )


def _protected_units(cfg: ExperimentConfig, data: FederatedData) -> int:
    """What one party protects, counted: clients under client-level DP, else the fewest
    records a client trains on (a few-shot client's support and query records)."""
    assert cfg.privacy is not None
    if cfg.privacy.mechanism == "client":
        return cfg.num_clients
    sizes = data.train.sizes
    if isinstance(data, FewShotData) and data.val is not None:
        sizes = sizes + data.val.sizes
    return int(sizes.min())


def build_data(cfg: ExperimentConfig) -> FederatedData:
    """Load the dataset and split it over clients as the config says (few-shot tasks with a
    ``fewshot`` mapping, flcore.data.fewshot)."""
    if cfg.fewshot is not None:
        return build_fewshot(cfg)
    splits = load_dataset(cfg.dataset, cfg.data_root)
    p = cfg.partition
    params = {
        "dominant": {"s": p.s},
        "dirichlet": {"beta": p.beta},
        "pathological": {"k": p.k},
    }.get(p.name, {})
    return build_federated_data(
        splits,
        num_clients=cfg.num_clients,
        samples_per_client=cfg.samples_per_client,
        test_samples_per_client=cfg.test_samples_per_client,
        partition=p.name,
        partition_params=params,
        seed=cfg.seed,
        client_split=(
            (cfg.client_split.train, cfg.client_split.val, cfg.client_split.test)
            if cfg.client_split is not None
            else None
        ),
        global_test_per_class=cfg.global_test_per_class,
        public_samples=cfg.public_samples,
    )


#: the few-shot class split of a dataset with no split of its own (FMNIST: Sec. 5's protocol
#: on the offline default, issue 26): meta-training classes, meta-testing classes
DEFAULT_CLASS_SPLIT = {
    "fmnist": ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9)),
}


def build_fewshot(cfg: ExperimentConfig) -> FewShotData:
    """Few-shot clients: the dataset's training split (FMNIST) or a class-structured few-shot
    dataset (flcore.data.metasets), with the config's or the dataset's class split."""
    f = cfg.fewshot
    assert f is not None
    from flcore.data.metasets import METASETS, load_class_pool

    if cfg.dataset in METASETS:
        pool = load_class_pool(cfg.dataset, cfg.data_root)
        splits = DatasetSplits(
            pool.info,
            ArrayDataset(pool.images, pool.labels),
            ArrayDataset(pool.images[:0], pool.labels[:0]),
            checksum=pool.checksum,
            source=pool.source,
        )
        default = (pool.meta_train, pool.meta_test)
    else:
        splits = load_dataset(cfg.dataset, cfg.data_root)
        classes = tuple(range(splits.info.num_classes))
        half = len(classes) // 2
        default = DEFAULT_CLASS_SPLIT.get(cfg.dataset, (classes[:half], classes[half:]))
    spec = FewShotSpec(
        n_way=f.n_way,
        k_shot=f.k_shot,
        query=f.query,
        test_query=f.test_query,
        train_classes=tuple(f.train_classes) if f.train_classes is not None else default[0],
        unseen_classes=tuple(f.unseen_classes) if f.unseen_classes is not None else default[1],
        unseen_clients=f.unseen_clients,
    )
    return build_fewshot_data(splits, spec, num_clients=cfg.num_clients, seed=cfg.seed)


def build_graph_of(cfg: ExperimentConfig) -> Any:
    """The communication graph ``cfg.graph`` names, drawn with the run's seed (None without)."""
    g = cfg.graph
    if g is None:
        return None
    from flcore.algorithms.meta.graph import build_graph

    return build_graph(
        g.name,
        cfg.num_clients,
        seed=cfg.seed,
        k=g.k,
        p=g.p,
        degree=g.degree,
        path=g.path,
        walk=g.walk,
    )


def build_capacity(cfg: ExperimentConfig) -> Capacity | None:
    """The clients' capacities ``cfg.capacity`` asks for (seeded by ``cfg.seed``), or None."""
    c = cfg.capacity
    if c is None:
        return None
    return make_capacity(
        c.name,
        num_clients=cfg.num_clients,
        seed=cfg.seed,
        low=c.low,
        high=c.high,
        ratios=c.ratios,
        p_min=c.p_min,
    )


def attack_probe(cfg: ExperimentConfig, factory: AlgorithmFactory) -> Any:
    """The privacy evaluation ``cfg.attack`` asks for, as an engine probe (its symbolic rounds
    resolved against ``cfg.rounds``)."""
    from flcore.attacks.evaluation import AttackSettings, LeakageEvaluator

    a = cfg.attack
    assert a is not None
    settings = AttackSettings(
        name=a.name,
        rounds=a.resolved_rounds(cfg.rounds),  # first/middle/last of this run's rounds
        clients=tuple(a.clients),
        images=a.images,
        batch=a.batch,
        local_steps=a.local_steps,
        labels=a.labels,
        params=dict(a.params) | ({"iterations": a.iterations} if a.iterations else {}),
        seed=a.seed,
        identify_k=a.identify_k,
        known=a.known,
    )
    return LeakageEvaluator(settings, factory)


def knowledge_probe(cfg: ExperimentConfig, factory: AlgorithmFactory) -> Any:
    """The knowledge inversion ``cfg.knowledge_attack`` asks for, as an engine probe."""
    from flcore.attacks.evaluation import AttackSettings
    from flcore.attacks.knowledge_inversion import KnowledgeInversionProbe

    a = cfg.knowledge_attack
    assert a is not None
    settings = AttackSettings(
        name=a.name,
        rounds=a.resolved_rounds(cfg.rounds),
        clients=tuple(a.clients),
        params=dict(a.params) | ({"iterations": a.iterations} if a.iterations else {}),
        seed=a.seed,
    )
    return KnowledgeInversionProbe(settings, factory)


def cap_gpu_memory(cfg: ExperimentConfig) -> None:
    """Apply ``gpu_memory_fraction`` to the run's CUDA device: an allocation past it raises
    ``torch.OutOfMemoryError`` (the vectorized executor halves its chunk and retries; the loop
    fails the run with it). Only PyTorch's caching allocator is capped, not the CUDA context
    (about 500 MB) or other libraries' memory."""
    if cfg.gpu_memory_fraction is None:
        return
    device = torch.device(cfg.device)
    if device.type != "cuda":
        raise ConfigError(
            "gpu_memory_fraction", f"caps a CUDA device's memory; this run's device is {cfg.device}"
        )
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(cfg.gpu_memory_fraction, index)


def build_engine(
    cfg: ExperimentConfig,
    *,
    data: FederatedData | None = None,
    callbacks: list[Callback] | None = None,
) -> Engine:
    """The engine for ``cfg``; pass ``data`` to reuse an already built federated dataset.

    Raises:
        ConfigError: ``early_stopping`` without validation records (before any data is built).
    """
    check_early_stopping(cfg)
    cap_gpu_memory(cfg)
    data = data if data is not None else build_data(cfg)
    info = data.info
    capacity = build_capacity(cfg)
    algorithm_cls = ALGORITHMS.get(cfg.algorithm)
    model_params = dict(cfg.model_params)
    if capacity is not None and not algorithm_cls.capacity_aware:
        # "the maximum model all users can compute" (Pa3dFL Sec. 6.1), for every client
        model_params["width"] = capacity.min_width
    model_spec = ModelSpec(
        cfg.model or ("conv4" if cfg.fewshot is not None else info.model),
        info.num_classes,
        info.in_channels,
        tuple(sorted(model_params.items())),
    )
    training = LocalTraining(
        epochs=cfg.local_epochs,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        optimizer=cfg.optimizer.name,
        momentum=cfg.optimizer.momentum,
        weight_decay=cfg.optimizer.weight_decay,
        lr_decay=cfg.lr_decay,
        lr_decay_every=cfg.lr_decay_every,
    )
    params = ALGORITHMS.get(cfg.algorithm).validate_params(cfg.algorithm_params)
    privacy = resolve_privacy(cfg, data)
    factory = AlgorithmFactory(
        cfg.algorithm,
        {
            "model_spec": model_spec,
            "training": training,
            "num_clients": cfg.num_clients,
            "params": params,
            "seed": cfg.seed,
            "device": cfg.device,
            "privacy": privacy,
            "capacity": capacity,
            "graph": build_graph_of(cfg),
        },
    )
    return Engine(
        factory,
        data,
        # the leakage probe first: the attack contract reads ``engine.probes[0]``
        probes=[
            *([attack_probe(cfg, factory)] if cfg.attack is not None else []),
            *([knowledge_probe(cfg, factory)] if cfg.knowledge_attack is not None else []),
        ]
        or None,
        rounds=cfg.rounds,
        client_fraction=cfg.client_fraction,
        full_last_round=cfg.full_last_round,
        eval_every=cfg.eval_every,
        global_eval_every=cfg.global_eval_every,
        seed=cfg.seed,
        workers=cfg.resolved_workers(),
        device=cfg.device,
        callbacks=callbacks,
        early_stopping_metric=cfg.early_stopping.metric if cfg.early_stopping else None,
        early_stopping_patience=cfg.early_stopping.patience if cfg.early_stopping else 0.2,
        early_stopping_window=cfg.early_stopping.window if cfg.early_stopping else 1,
        early_stopping_report=cfg.early_stopping.report if cfg.early_stopping else "window",
        executor=cfg.executor,
        executor_chunk=cfg.executor_chunk,
    )
