"""Build an engine from a validated config: the one place where config becomes typed arguments."""

from __future__ import annotations

from flcore.algorithms import ALGORITHMS, LocalTraining, ModelSpec
from flcore.callbacks import Callback
from flcore.config import ExperimentConfig
from flcore.data import FederatedData, build_federated_data, load_dataset
from flcore.engine import Engine
from flcore.executor import AlgorithmFactory

__all__ = ["build_data", "build_engine"]


def build_data(cfg: ExperimentConfig) -> FederatedData:
    """Load the dataset and split it over clients as the config says."""
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
    )


def build_engine(
    cfg: ExperimentConfig,
    *,
    data: FederatedData | None = None,
    callbacks: list[Callback] | None = None,
) -> Engine:
    """The engine for ``cfg``; pass ``data`` to reuse an already built federated dataset."""
    data = data if data is not None else build_data(cfg)
    info = data.info
    model_spec = ModelSpec(cfg.model or info.model, info.num_classes, info.in_channels)
    training = LocalTraining(
        epochs=cfg.local_epochs,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        optimizer=cfg.optimizer.name,
        momentum=cfg.optimizer.momentum,
        weight_decay=cfg.optimizer.weight_decay,
    )
    params = ALGORITHMS.get(cfg.algorithm).validate_params(cfg.algorithm_params)
    factory = AlgorithmFactory(
        cfg.algorithm,
        {
            "model_spec": model_spec,
            "training": training,
            "num_clients": cfg.num_clients,
            "params": params,
            "seed": cfg.seed,
            "device": cfg.device,
        },
    )
    return Engine(
        factory,
        data,
        rounds=cfg.rounds,
        client_fraction=cfg.client_fraction,
        full_last_round=cfg.full_last_round,
        eval_every=cfg.eval_every,
        seed=cfg.seed,
        workers=cfg.resolved_workers(),
        device=cfg.device,
        callbacks=callbacks,
    )
