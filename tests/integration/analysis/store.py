"""A real sqlite MLflow store for the analysis tests, filled by the project's own code.

Experiment ``fl-runs`` holds single runs made by ``run_experiment`` on real Fashion-MNIST
(4 clients x 100 samples x 2 rounds): FedAvg, Local-only with seeds 0 and 1 (one configuration,
two seeds), DP-FedAvg (a finite epsilon) and HyperFL (about 128x FedAvg's upload). The FedAvg
run also runs a (short) IG attack on its last round, so it carries real leak metrics and the
image grid ``attack/reconstructions.png``. One synthetic edge case comes through MlflowClient: a
FAILED run whose metrics would dominate every front.

Experiment ``fl-sweep`` holds a sweep's shape: a parent run made as ``run_sweep`` makes it
(tags, and the spec logged by ``sweeps.sweep._log_spec`` from a validated spec) and two
Local-only children made by ``run_experiment`` under it.

Experiment ``fl-trust`` holds what a front must not believe (issue 23 §1): a real PPSGD run
under the paper's protocol (``personal_dp: false``, so ``dp_guarantee=shared-only``), a CENTAUR
run as stores made before flcore reported ``epsilon = inf`` hold it (tagged shared-only, its
shared part's finite epsilon logged as ``epsilon``, and values that would dominate every
front), and two DP runs whose epsilons are under different neighbouring relations.

Experiment ``fl-trust-sweep`` holds a sweep whose objectives are not the default ones
(``accuracy:max, bytes_up:min``) and its trials in every outcome the sweep driver records
(issue 23 §3): finished, FAILED, stopped early by ASHA (MLflow KILLED, tag ``status=PRUNED``,
``stopped_early``, ``rounds_completed``), finished without an objective value, and an
ASHA-stopped trial as sweeps before that tag closed it (FINISHED after 1 of 2 rounds). The
failed and stopped ones would dominate the front if they were believed. These runs are written
through MlflowClient with the tags the driver writes: a real sweep with ASHA takes minutes.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SWEEP_NAME = "tiny-sweep"
TRUST_SWEEP = "trust-sweep"
TRUST_OBJECTIVES = {"accuracy": "max", "bytes_up": "min"}
ATTACK = {"name": "ig", "images": 2, "iterations": 30}


@dataclass
class Store:
    """Where the store is and which run is which."""

    root: Path
    uri: str
    runs: dict[str, str] = field(default_factory=dict)  # label -> run id
    parent_run_id: str = ""

    @property
    def db(self) -> Path:
        return self.root / "mlflow.db"

    def save(self) -> None:
        """Record the labels beside the store, so a later session can reuse it."""
        doc = asdict(self) | {"root": str(self.root)}
        (self.root / "store.json").write_text(json.dumps(doc, indent=1))

    @classmethod
    def reuse(cls, root: Path) -> Store | None:
        """The store built earlier under ``root``, if it is complete."""
        path = root / "store.json"
        if not (path.is_file() and (root / "mlflow.db").is_file()):
            return None
        doc = json.loads(path.read_text())
        return cls(Path(doc["root"]), doc["uri"], doc["runs"], doc["parent_run_id"])


def base_config(data_root: Path, output_dir: Path, **over: Any) -> dict[str, Any]:
    """2 rounds of 4 clients x 100 real FMNIST samples; evaluated once, in the last round."""
    cfg = {
        "experiment": "fl-runs",
        "algorithm": "fedavg",
        "dataset": "fmnist",
        "data_root": str(data_root),
        "num_clients": 4,
        "global_test_per_class": 50,
        "samples_per_client": 100,
        "test_samples_per_client": 100,
        "rounds": 2,
        "local_epochs": 1,
        "batch_size": 50,
        "lr": 0.05,
        "eval_every": 2,
        "seed": 0,
        "workers": 1,
        "output_dir": str(output_dir),
        "partition": {"name": "dominant", "s": 20},
    }
    return cfg | over


def _run(cfg: dict[str, Any], parent_run_id: str | None = None) -> str:
    from flcore.config import validate_config
    from sweeps.experiment import run_experiment

    result = run_experiment(validate_config(cfg), progress=False, parent_run_id=parent_run_id)
    return str(result["run_id"])


def _failed_run(client: Any, experiment_id: str) -> str:
    from mlflow.entities import Metric, Param

    run = client.create_run(
        experiment_id,
        run_name="fedavg-failed",
        tags={"algorithm": "fedavg", "status": "FAILED", "failure_reason": "error"},
    )
    run_id = run.info.run_id
    client.log_batch(
        run_id,
        metrics=[Metric("accuracy", 0.99, 0, 1), Metric("epsilon", 0.0, 0, 1)],
        params=[Param("algorithm", "fedavg"), Param("dataset", "fmnist")],
    )
    client.set_terminated(run_id, status="FAILED")
    return run_id


def _sweep_parent(
    client: Any,
    experiment_id: str,
    data_root: Path,
    tmp: Path,
    *,
    name: str = SWEEP_NAME,
    experiment: str = "fl-sweep",
    objectives: dict[str, str] | None = None,
) -> str:
    """A parent run as ``run_sweep`` creates it, holding a validated spec."""
    from sweeps.provenance import provenance_tags
    from sweeps.spec import validate_spec
    from sweeps.sweep import _log_spec

    spec = validate_spec(
        {
            "name": name,
            "base": base_config(data_root, tmp / "runs", experiment=experiment),
            "algorithms": ["local"],
            "objectives": objectives or {"accuracy": "max", "epsilon": "min"},
            "num_samples": 2,
        }
    )
    parent = client.create_run(
        experiment_id,
        run_name=f"sweep-{name}",
        tags={"fedsweep.sweep": name, "fedsweep.kind": "sweep", **provenance_tags()},
    )
    _log_spec(client, parent.info.run_id, spec)
    client.set_terminated(parent.info.run_id, status="FINISHED")
    return str(parent.info.run_id)


def _logged_run(
    client: Any,
    experiment_id: str,
    algorithm: str,
    metrics: dict[str, float],
    *,
    tags: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    status: str = "FINISHED",
) -> str:
    """A run written through MlflowClient: the tags, params and final metrics given."""
    from mlflow.entities import Metric, Param

    run = client.create_run(
        experiment_id, run_name=algorithm, tags={"algorithm": algorithm, **(tags or {})}
    )
    run_id = run.info.run_id
    params = {"algorithm": algorithm, "dataset": "fmnist", "rounds": "2"} | (params or {})
    client.log_batch(
        run_id,
        metrics=[Metric(k, v, 0, 2) for k, v in metrics.items()],
        params=[Param(k, v) for k, v in params.items()],
    )
    client.set_terminated(run_id, status=status)
    return str(run_id)


def _trust_runs(client: Any, store: Store, base: dict[str, Any], dp: dict[str, Any]) -> None:
    """Experiment ``fl-trust`` (see the module docstring)."""
    store.runs["ppsgd-shared"] = _run(
        base
        | {
            "experiment": "fl-trust",
            "algorithm": "ppsgd",
            "algorithm_params": {"personal_dp": False},
            "privacy": dp,
        }
    )
    exp = client.get_experiment_by_name("fl-trust").experiment_id
    store.runs["centaur-old"] = _logged_run(
        client,
        exp,
        "centaur",
        {"accuracy": 0.99, "epsilon": 0.01, "bytes_up": 1.0},
        tags={"dp_guarantee": "shared-only"},
    )
    store.runs["isrl-add-remove"] = _logged_run(
        client,
        exp,
        "dp_fedavg",
        {"accuracy": 0.5, "epsilon": 2.0, "bytes_up": 100.0},
        tags={"dp_guarantee": "isrl", "dp_relation": "add-remove"},
    )
    store.runs["client-replace-one"] = _logged_run(
        client,
        exp,
        "dp_fedavg_client",
        {"accuracy": 0.6, "epsilon": 3.0, "bytes_up": 100.0},
        tags={
            "dp_guarantee": "client-level",
            "dp_relation": "replace-one",
            "client_sampling": "fixed",
        },
    )


def _trust_sweep(client: Any, store: Store, data_root: Path, root: Path) -> None:
    """Experiment ``fl-trust-sweep`` (see the module docstring)."""
    exp = client.create_experiment("fl-trust-sweep")
    parent = _sweep_parent(
        client,
        exp,
        data_root,
        root,
        name=TRUST_SWEEP,
        experiment="fl-trust-sweep",
        objectives=TRUST_OBJECTIVES,
    )
    store.runs["trust-parent"] = parent
    trials = {  # label: (MLflow status, tags, metrics); every trial also logs epsilon inf
        "trial-ok": ("FINISHED", {"status": "FINISHED"}, {"accuracy": 0.6, "bytes_up": 1e4}),
        "trial-failed": (
            "FAILED",
            {"status": "FAILED", "failure_reason": "error"},
            {"accuracy": 0.99, "bytes_up": 1.0},
        ),
        "trial-stopped": (
            "KILLED",
            {"status": "PRUNED", "stopped_early": "true", "rounds_completed": "1"},
            {"accuracy": 0.95, "bytes_up": 10.0, "round": 1},
        ),
        "trial-unmeasured": ("FINISHED", {"status": "FINISHED"}, {"accuracy": 0.97}),
        "trial-old-asha": (
            "FINISHED",
            {"status": "FINISHED"},
            {"accuracy": 0.9, "bytes_up": 5.0, "round": 1},
        ),
    }
    for number, (label, (status, tags, metrics)) in enumerate(trials.items()):
        metrics = {"round": 2, "epsilon": math.inf} | metrics
        store.runs[label] = _logged_run(
            client,
            exp,
            "fedavg",
            metrics,
            status=status,
            tags={
                "mlflow.parentRunId": parent,
                "fedsweep.sweep": TRUST_SWEEP,
                "fedsweep.trial_id": f"trial_{number}",
                "fedsweep.optuna_trial": str(number),
                **tags,
            },
        )


def build_store(root: Path, data_root: Path, fmnist: Any) -> Store:
    """Fill ``root/mlflow.db``; takes about a minute on two busy cores."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{root / 'mlflow.db'}"
    store = Store(root=root, uri=uri)
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        out = root / "runs"
        base = base_config(data_root, out)
        store.runs["fedavg"] = _run(base | {"attack": ATTACK})
        store.runs["local-s0"] = _run(base | {"algorithm": "local"})
        store.runs["local-s1"] = _run(base | {"algorithm": "local", "seed": 1})
        store.runs["hyperfl"] = _run(base | {"algorithm": "hyperfl"})
        dp = {"mechanism": "dpsgd", "noise_multiplier": 1.0, "delta": 1e-5, "clip": 1.0}
        store.runs["dp_fedavg"] = _run(base | {"algorithm": "dp_fedavg", "privacy": dp})

        client = MlflowClient(tracking_uri=uri)
        runs_exp = client.get_experiment_by_name("fl-runs").experiment_id
        store.runs["failed"] = _failed_run(client, runs_exp)

        sweep_exp = client.create_experiment("fl-sweep")
        store.parent_run_id = _sweep_parent(client, sweep_exp, data_root, root)
        for seed in (0, 1):
            cfg = base | {"experiment": "fl-sweep", "algorithm": "local", "lr": 0.02 * (1 + seed)}
            run_id = _run(cfg, parent_run_id=store.parent_run_id)
            client.set_tag(run_id, "fedsweep.sweep", SWEEP_NAME)
            client.set_tag(run_id, "algorithm", "local")
            store.runs[f"sweep-local-{seed}"] = run_id
        _trust_runs(client, store, base, dp)
        _trust_sweep(client, store, data_root, root)
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous
    store.save()
    return store
