"""``early_stopping.report: all_clients``: the run reports the state its best window ended with,
measured on every client, on real Fashion-MNIST (the engine, checkpoints, the refusal, the
sweep trainable and `fedsweep run`)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from flcore.callbacks import Callback, RoundResult
from flcore.config import load_config, validate_config
from flcore.data import FederatedData
from flcore.engine import CLIENT_ACCURACIES, Engine
from flcore.errors import ConfigError
from flcore.experiment import build_data, build_engine
from flcore.testing.algorithm_contract import state_equal

ROOT = Path(__file__).resolve().parents[2]
TIMING = {"seconds", "bytes_up", "bytes_down"}


@pytest.fixture(scope="module")
def raw(data_root: Path) -> dict[str, Any]:
    """FedAvg on 4 clients of two widths, half of them a round, a 3-round window: the window's
    means are over different clients' evaluations of different states."""
    return {
        "experiment": "tests",
        "algorithm": "fedavg",
        "dataset": "fmnist",
        "data_root": str(data_root),
        "model": "pa3dfl_cnn_fmnist",
        "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 1.0, 0.25]},
        "num_clients": 4,
        "samples_per_client": 100,
        "global_test_per_class": 50,  # the server's test set, 500 records: fast
        "client_split": {"train": 0.6, "val": 0.2, "test": 0.2},
        "rounds": 8,
        "local_epochs": 1,
        "batch_size": 20,
        "lr": 0.05,
        "seed": 3,
        "workers": 1,
        "client_fraction": 0.5,
        "full_last_round": False,
        "early_stopping": {
            "metric": "val_accuracy",
            "patience": 0.25,
            "window": 3,
            "report": "all_clients",
        },
    }


@pytest.fixture(scope="module")
def data(raw: dict[str, Any]) -> FederatedData:
    return build_data(validate_config(raw))


def _window(raw: dict[str, Any]) -> dict[str, Any]:
    return raw | {"early_stopping": raw["early_stopping"] | {"report": "window"}}


def _engine(raw: dict[str, Any], data: FederatedData, **kw: Any) -> Engine:
    return build_engine(validate_config(raw), data=data, **kw)


class _SaveBest(Callback):
    """Writes the engine's checkpoint after each round that ends a new best window (as the
    benchmark scripts keep ``best.pt``): the reference the engine's own copy is checked on."""

    def __init__(self, path: Path) -> None:
        self.path, self.engine = path, None

    def on_round_end(self, result: RoundResult) -> None:
        if self.engine.best_round == result.round:
            self.engine.save_checkpoint(self.path)


def _run_to(engine: Engine, round: int) -> Engine:
    """``engine`` after the end of ``round``."""
    rounds = engine.iter_rounds()
    for result in rounds:
        if result.round == round:
            break
    rounds.close()
    return engine


class _Stages(Callback):
    def __init__(self) -> None:
        self.messages: list[str] = []

    def on_stage(self, message: str) -> None:
        self.messages.append(message)


def _strip(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in TIMING}


def test_the_best_state_is_measured_on_every_client(
    raw: dict[str, Any], data: FederatedData, tmp_path: Path
) -> None:
    stages = _Stages()
    engine = _engine(raw, data, callbacks=[stages])
    saver = _SaveBest(tmp_path / "best.pt")
    twin = _engine(_window(raw), data, callbacks=[saver])
    saver.engine = twin
    summary, window = engine.run(), twin.run()
    # the same run: the kept copy changes nothing of the rounds
    assert [h.metrics["val_accuracy"] for h in engine.history] == [
        h.metrics["val_accuracy"] for h in twin.history
    ]
    for key in ("best_round", "best_window_start", "rounds_completed", "early_stopped"):
        assert summary[key] == window[key]
    assert "evaluated_clients" not in window

    # the reference: the twin's state after the best round, measured on every client
    ref = _engine(_window(raw), data)
    ref.load_checkpoint(saver.path)
    assert ref.round == summary["best_round"]
    expected = ref.evaluate_clients()
    glob = ref.algorithm.evaluate_server(data, ref.client_states, torch.device("cpu"))
    assert summary["evaluated_clients"] == expected["clients"] == 4
    for key in CLIENT_ACCURACIES:
        assert summary[key] == expected[key] is not None
        rows = [row[key] for row in expected["per_client"]]
        assert summary[key] == pytest.approx(np.mean(rows))
    widths = {
        k: v for k, v in expected.items() if k.startswith(CLIENT_ACCURACIES) and "_width" in k
    }
    assert {"accuracy_width_1", "accuracy_width_0.5", "accuracy_worst_width"} <= set(widths)
    assert {k: summary[k] for k in widths} == widths
    assert summary["global_accuracy"] == glob["global_accuracy"] is not None
    rows = engine.best_state_evaluation()["per_client"]
    assert [r["client"] for r in rows] == [0, 1, 2, 3]
    assert [r["width"] for r in rows] == [1.0, 0.5, 1.0, 0.5]

    # the engine itself is left at its last round, as the twin is
    assert engine.round == twin.round
    assert state_equal(engine.algorithm.state_dict(), twin.algorithm.state_dict())
    # summaries are repeatable: measured once, and said so once (a progress line)
    assert engine.summary() == summary
    assert stages.messages == [
        f"measuring every client (4) on the state after round {summary['best_round']}, "
        "the best validation window's last"
    ]


def test_a_checkpoint_carries_the_best_state_and_its_measurement(
    raw: dict[str, Any], data: FederatedData, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = _engine(raw, data)
    expected = whole.run()

    first = _run_to(_engine(raw, data), 4)
    assert first.best_round is not None and first.best_round <= 4
    mid = first.save_checkpoint(tmp_path / "mid.pt")
    resumed = _engine(raw, data)
    resumed.load_checkpoint(mid)
    assert _strip(resumed.run()) == _strip(expected)

    # an ended run's checkpoint holds the measurement: read back, nothing is run again
    end = whole.save_checkpoint(tmp_path / "end.pt")
    again = _engine(raw, data)
    again.load_checkpoint(end)

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("measured again")

    monkeypatch.setattr(again, "evaluate_clients", refuse)
    assert _strip(again.summary()) == _strip(expected)


def test_a_window_checkpoint_resumed_under_all_clients_says_what_it_lacks(
    raw: dict[str, Any], data: FederatedData, tmp_path: Path
) -> None:
    first = _run_to(_engine(_window(raw), data), 3)
    path = first.save_checkpoint(tmp_path / "ckpt.pt")
    resumed = _engine(raw, data)
    with pytest.warns(UserWarning, match="holds no best-validation state"):
        resumed.load_checkpoint(path)
    # and a checkpoint of its own rule loads silently
    own = _run_to(_engine(raw, data), 3)
    own.save_checkpoint(tmp_path / "own.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _engine(raw, data).load_checkpoint(tmp_path / "own.pt")


def test_all_clients_is_refused_where_clients_do_not_measure_themselves() -> None:
    over = [
        "client_split.train=0.8",
        "client_split.val=0.1",
        "client_split.test=0.1",
        "early_stopping.report=all_clients",
    ]
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "sweeps" / "configs" / "lodmeta" / "fmnist_lodmeta.yaml", over)
    assert err.value.key == "early_stopping.report"
    assert "walk" in str(err.value)
    with pytest.raises(ConfigError) as err:
        validate_config({"algorithm": "fedavg", "early_stopping": {"report": "every"}})
    assert err.value.key == "early_stopping.report"


def test_the_sweep_trainable_reports_every_client_on_the_best_state(
    raw: dict[str, Any], trial_steps: Any
) -> None:
    t, reports = trial_steps(
        {"algorithm": "fedavg"},
        max_steps=8,
        base=validate_config(raw).model_dump(mode="json"),
        seeds=[3],
        rounds_per_step=4,
        objectives=["accuracy"],
        fills={},
    )
    last, engine = reports[-1], t.engines[0]
    evaluation = engine.best_state_evaluation()
    assert evaluation is not None
    assert last["evaluated_clients"] == 4
    for key in (*CLIENT_ACCURACIES, "accuracy_worst_width", "global_accuracy"):
        assert last[key] == evaluation[key]
    assert "evaluated_clients" not in reports[0]


def test_fedsweep_run_logs_every_clients_rows(
    raw: dict[str, Any], tmp_path: Path, fedsweep_run: Any
) -> None:
    doc = fedsweep_run(raw | {"output_dir": "runs"}, tmp_path)
    assert doc["evaluated_clients"] == 4
    rows = json.loads((tmp_path / "runs" / doc["run_id"] / "all_clients.json").read_text())
    assert rows["clients"] == 4 and len(rows["per_client"]) == 4
    assert doc["accuracy"] == pytest.approx(np.mean([r["accuracy"] for r in rows["per_client"]]))

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(doc["run_id"])
    assert run.data.metrics["evaluated_clients"] == 4
    assert run.data.metrics["accuracy"] == pytest.approx(doc["accuracy"])
    assert "all_clients.json" in {a.path for a in client.list_artifacts(doc["run_id"])}
