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
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SWEEP_NAME = "tiny-sweep"
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


def _sweep_parent(client: Any, experiment_id: str, data_root: Path, tmp: Path) -> str:
    """A parent run as ``run_sweep`` creates it, holding a validated spec."""
    from sweeps.provenance import provenance_tags
    from sweeps.spec import validate_spec
    from sweeps.sweep import _log_spec

    spec = validate_spec(
        {
            "name": SWEEP_NAME,
            "base": base_config(data_root, tmp / "runs", experiment="fl-sweep"),
            "algorithms": ["local"],
            "objectives": {"accuracy": "max", "epsilon": "min"},
            "num_samples": 2,
        }
    )
    parent = client.create_run(
        experiment_id,
        run_name=f"sweep-{SWEEP_NAME}",
        tags={"fedsweep.sweep": SWEEP_NAME, "fedsweep.kind": "sweep", **provenance_tags()},
    )
    _log_spec(client, parent.info.run_id, spec)
    client.set_terminated(parent.info.run_id, status="FINISHED")
    return str(parent.info.run_id)


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
    finally:
        if previous is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous
    store.save()
    return store
