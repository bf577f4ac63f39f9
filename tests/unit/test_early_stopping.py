"""Early stopping on validation (Pa3dFL, Appendix D.3) on real Fashion-MNIST: where a run stops,
what it reports, checkpoints, the refusal without validation records, the sweep trainable, and
`fedsweep run`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from flcore.callbacks import Callback
from flcore.config import validate_config
from flcore.data import FederatedData
from flcore.engine import CLIENT_ACCURACIES, Engine, window_mean
from flcore.errors import ConfigError
from flcore.experiment import build_data, build_engine

ROUNDS, PATIENCE = 20, 0.1  # stop once 2 rounds pass without a gain (round - best > 2)


@pytest.fixture(scope="module")
def es_config(data_root: Path) -> dict[str, Any]:
    """Local-only on 4 clients x 100 records (60/20/20 train/val/test); at lr 0.005 the
    clients' validation accuracy climbs for a few rounds, then stalls."""
    return {
        "experiment": "tests",
        "algorithm": "local",
        "dataset": "fmnist",
        "data_root": str(data_root),
        "num_clients": 4,
        "global_test_per_class": 50,
        "samples_per_client": 100,
        "client_split": {"train": 0.6, "val": 0.2, "test": 0.2},
        "rounds": ROUNDS,
        "local_epochs": 1,
        "batch_size": 20,
        "lr": 0.005,
        "seed": 3,
        "workers": 1,
        "partition": {"name": "dominant", "s": 20},
        "early_stopping": {"metric": "val_accuracy", "patience": PATIENCE},
    }


@pytest.fixture(scope="module")
def es_data(es_config: dict[str, Any]) -> FederatedData:
    return build_data(validate_config(es_config))


class _Summary(Callback):
    def __init__(self) -> None:
        self.summary: dict[str, Any] | None = None

    def on_run_end(self, summary: dict[str, Any]) -> None:
        self.summary = summary


def _engine(raw: dict[str, Any], data: FederatedData, **cb: Any) -> Engine:
    return build_engine(validate_config(raw), data=data, **cb)


def _checkpoint_after(engine: Engine, round: int, path: Path) -> Path:
    """Run ``engine`` to the end of ``round``, then write its checkpoint to ``path``."""
    rounds = engine.iter_rounds()
    for result in rounds:
        if result.round == round:
            break
    rounds.close()
    return engine.save_checkpoint(path)


def _accuracy_keys(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if k.startswith(CLIENT_ACCURACIES)}


def test_stops_after_patience_and_reports_the_best_validation_round(
    es_config: dict[str, Any], es_data: FederatedData
) -> None:
    rec = _Summary()
    # two widths, so that per-width accuracies are reported
    widths = {
        "model": "pa3dfl_cnn_fmnist",
        "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 1.0, 0.25]},
    }
    engine = _engine(es_config | widths, es_data, callbacks=[rec])
    summary = engine.run()

    vals = [h.metrics["val_accuracy"] for h in engine.history]
    best_round = 1 + vals.index(max(vals))  # the first round reaching the maximum
    stop = best_round + math.floor(PATIENCE * ROUNDS) + 1
    assert stop < ROUNDS  # the premise: this run does stop early
    assert engine.round == len(engine.history) == stop
    assert engine.stopped_early and engine.finished
    # every round after the best was measured and brought no gain
    assert all(v <= vals[best_round - 1] for v in vals[best_round:])
    assert summary["rounds_completed"] == stop and summary["rounds"] == stop
    assert summary["best_round"] == best_round and summary["early_stopped"] == 1.0
    assert summary["best_val_accuracy"] == vals[best_round - 1]
    best = engine.history[best_round - 1].metrics
    chosen = _accuracy_keys(best)
    assert any("_width_" in k for k in chosen)  # the per-width keys are the best round's too
    assert _accuracy_keys(summary) == chosen
    assert summary["accuracy"] != engine.history[-1].metrics["accuracy"]  # not the last round's
    assert rec.summary == summary
    # a finished run does not start again
    assert list(engine.iter_rounds()) == [] and engine.round == stop


def test_a_checkpoint_mid_run_resumes_to_the_same_stop(
    es_config: dict[str, Any], es_data: FederatedData, tmp_path: Path
) -> None:
    whole = _engine(es_config, es_data)
    expected = whole.run()

    first = _engine(es_config, es_data)
    path = _checkpoint_after(first, 4, tmp_path / "ckpt.pt")

    resumed = _engine(es_config, es_data)
    resumed.load_checkpoint(path)
    assert (resumed.best_round, resumed.best_value) == (first.best_round, first.best_value)
    got = resumed.run()

    # an older checkpoint without the early-stopping state rebuilds it from the history
    state = torch.load(path, weights_only=False)
    del state["early_stopping"]
    old = _engine(es_config, es_data)
    old.load_state_dict(state)
    got_old = old.run()

    timing = {"seconds", "bytes_up", "bytes_down"}
    for summary in (got, got_old):
        assert {k: v for k, v in summary.items() if k not in timing} == {
            k: v for k, v in expected.items() if k not in timing
        }
    assert [h.metrics["val_accuracy"] for h in resumed.history] == [
        h.metrics["val_accuracy"] for h in whole.history
    ]


def test_without_early_stopping_the_summary_is_the_last_round(
    es_config: dict[str, Any], es_data: FederatedData
) -> None:
    raw = {k: v for k, v in es_config.items() if k != "early_stopping"} | {"rounds": 3}
    engine = _engine(raw, es_data)
    summary = engine.run()
    assert engine.round == 3 and not engine.stopped_early
    assert not {"rounds_completed", "best_round", "early_stopped"} & set(summary)
    assert _accuracy_keys(summary) == _accuracy_keys(engine.history[-1].metrics)


@pytest.mark.parametrize(
    "change, key",
    [
        ({"client_split": None}, "early_stopping"),
        ({"client_split": {"train": 0.8, "val": 0.0, "test": 0.2}}, "early_stopping"),
        ({"early_stopping": {"metric": "accuracy"}}, "early_stopping.metric"),
    ],
)
def test_early_stopping_without_validation_records_is_refused_before_any_work(
    es_config: dict[str, Any], change: dict, key: str
) -> None:
    # refused where the config is validated: before any data, MLflow run or Ray trial
    with pytest.raises(ConfigError) as err:
        validate_config(es_config | change)
    assert err.value.key == key


def test_the_sweep_trainable_ends_an_early_stopped_run_complete(
    es_config: dict[str, Any], trial_steps: Any
) -> None:
    from sweeps.search import OutcomeRule

    t, reports = trial_steps(
        {"algorithm": "local"},
        max_steps=ROUNDS,
        base=validate_config(es_config).model_dump(mode="json"),
        seeds=[3],
        rounds_per_step=4,
        objectives=["accuracy"],
        fills={},
    )
    last, engine = reports[-1], t.engines[0]
    assert engine.stopped_early
    assert last["rounds_completed"] == last["rounds_total"] == engine.round < ROUNDS
    assert last["best_round"] == engine.best_round
    assert last["accuracy"] == engine.history[engine.best_round - 1].metrics["accuracy"]
    # an earlier report of the same run, still running, counts the config's rounds
    assert reports[0]["rounds_total"] == ROUNDS and not reports[0]["done"]
    outcome = OutcomeRule((("accuracy", "max"),), {}).outcome(last)
    assert outcome.state == "COMPLETE" and outcome.rounds_completed == engine.round


def test_a_global_model_reports_the_best_rounds_global_accuracy(
    es_config: dict[str, Any], es_data: FederatedData
) -> None:
    # FedAvg at a step size so large that round 2 loses what round 1 learned; 3 rounds,
    # stopping once 0.6 rounds pass without a gain
    raw = es_config | {
        "algorithm": "fedavg",
        "rounds": 3,
        "lr": 3.0,
        "early_stopping": {"metric": "val_accuracy", "patience": 0.2},
    }
    engine = _engine(raw, es_data)
    summary = engine.run()
    vals = [h.metrics["val_accuracy"] for h in engine.history]
    assert engine.stopped_early and engine.round == 2 and vals[1] <= vals[0]
    best_round = 1
    best = engine.history[best_round - 1].metrics
    assert summary["global_accuracy"] == best["global_accuracy"] is not None
    assert summary["best_round"] == 1 and summary["best_val_accuracy"] == vals[0]
    assert _accuracy_keys(summary) == _accuracy_keys(best)


def test_fedsweep_run_ends_an_early_stopped_run_finished(
    es_config: dict[str, Any], tmp_path: Path, fedsweep_run: Any
) -> None:
    # a step size whose validation accuracy peaks early: 6 rounds, stop once 1.2 rounds pass
    # without a gain
    raw = es_config | {
        "rounds": 6,
        "lr": 0.1,
        "early_stopping": {"metric": "val_accuracy", "patience": 0.2},
        "output_dir": "runs",
    }
    doc = fedsweep_run(raw, tmp_path)
    assert doc["early_stopped"] == 1.0
    assert doc["rounds_completed"] < 6 and doc["rounds_completed"] == doc["best_round"] + 2
    rows = pd.read_parquet(doc["metrics_path"]).set_index("round")
    assert list(rows.index) == list(range(1, doc["rounds_completed"] + 1))
    best = rows.loc[doc["best_round"]]
    assert doc["best_round"] == int(rows["val_accuracy"].idxmax())
    for key in ("accuracy", "accuracy_before"):
        assert doc[key] == pytest.approx(best[key])
    assert doc["accuracy"] != pytest.approx(rows["accuracy"].iloc[-1])  # not the last round's

    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(doc["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["rounds_completed"] == doc["rounds_completed"]
    assert run.data.metrics["accuracy"] == pytest.approx(best["accuracy"])


def test_a_window_tracks_the_mean_of_the_last_rounds_and_reports_its_means(
    es_config: dict[str, Any], es_data: FederatedData, tmp_path: Path
) -> None:
    # half the clients a round, two widths: a round may sample one width cluster only
    window = 3
    raw = es_config | {
        "model": "pa3dfl_cnn_fmnist",
        "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 1.0, 0.25]},
        "client_fraction": 0.5,
        "full_last_round": False,
        "early_stopping": {"metric": "val_accuracy", "patience": 0.25, "window": window},
    }
    engine = _engine(raw, es_data)
    summary = engine.run()
    vals = [h.metrics["val_accuracy"] for h in engine.history]
    # the mean of the last 3 rounds' values (of the first 1 and 2 in rounds 1 and 2)
    means = [window_mean(vals[max(0, i - window + 1) : i + 1]) for i in range(len(vals))]
    best_round = 1 + means.index(max(means))  # the first window reaching the maximum
    assert best_round >= window  # the premise: a full window is the best
    assert summary["best_round"] == best_round
    assert summary["best_val_accuracy"] == pytest.approx(max(means))
    assert summary["best_window_start"] == best_round - window + 1
    if engine.stopped_early:
        assert engine.round == best_round + math.floor(0.25 * ROUNDS) + 1
    rows = [h.metrics for h in engine.history[best_round - window : best_round]]
    for key in ("accuracy", "accuracy_before"):
        assert summary[key] == pytest.approx(sum(m[key] for m in rows) / window)
    clusters = {}
    for key in {k for m in rows for k in m if k.startswith("accuracy_width_")}:
        present = [m[key] for m in rows if key in m]
        clusters[key] = sum(present) / len(present)
        assert summary[key] == pytest.approx(clusters[key])
    assert len(clusters) == 2
    assert summary["accuracy_worst_width"] == pytest.approx(min(clusters.values()))

    # a checkpoint written under another window replays the history under this one
    first = _engine(raw | {"early_stopping": {"metric": "val_accuracy", "patience": 0.25}}, es_data)
    path = _checkpoint_after(first, 5, tmp_path / "ckpt.pt")
    resumed = _engine(raw, es_data)
    resumed.load_checkpoint(path)
    timing = {"seconds", "bytes_up", "bytes_down"}
    assert {k: v for k, v in resumed.run().items() if k not in timing} == {
        k: v for k, v in summary.items() if k not in timing
    }


def test_a_window_below_one_is_refused(es_config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError) as err:
        validate_config(es_config | {"early_stopping": {"metric": "val_accuracy", "window": 0}})
    assert err.value.key.startswith("early_stopping")
