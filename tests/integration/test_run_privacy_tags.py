"""`fedsweep run`'s experiment (in process): its MLflow run and its JSON result carry every
privacy tag of the algorithm (dp_guarantee, dp_relation, client_sampling), on a real sqlite
store and real FMNIST."""

from __future__ import annotations

from pathlib import Path

import pytest

from flcore.config import validate_config
from sweeps.experiment import run_experiment


def test_client_level_run_is_tagged_with_its_relation_and_sampling(
    tiny_config: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    cfg = validate_config(
        tiny_config
        | {
            "algorithm": "dp_fedavg_client",
            "rounds": 1,
            "privacy": {
                "mechanism": "client",
                "noise_multiplier": 1.0,
                "clip": 0.05,
                "client_sampling": "fixed",
            },
        }
    )
    doc = run_experiment(cfg, progress=False)
    expected = {
        "dp_guarantee": "client-level",
        "dp_relation": "replace-one",
        "client_sampling": "fixed",
    }
    assert {k: doc[k] for k in expected} == expected

    from mlflow.tracking import MlflowClient

    tags = MlflowClient(tracking_uri=uri).get_run(doc["run_id"]).data.tags
    assert {k: tags.get(k) for k in expected} == expected
