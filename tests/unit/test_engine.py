"""The engine on real Fashion-MNIST: a short FedAvg run, determinism, checkpoints, Local-only."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from flcore.callbacks import Callback, RoundResult
from flcore.config import validate_config
from flcore.experiment import build_data, build_engine


class Recorder(Callback):
    def __init__(self) -> None:
        self.rounds: list[RoundResult] = []
        self.summary: dict | None = None

    def on_round_end(self, result: RoundResult) -> None:
        self.rounds.append(result)

    def on_run_end(self, summary: dict) -> None:
        self.summary = summary


def _run(raw: dict[str, Any], **overrides: Any) -> tuple[Recorder, Any]:
    cfg = validate_config(raw | overrides)
    rec = Recorder()
    engine = build_engine(cfg, callbacks=[rec])
    engine.run()
    return rec, engine


def _weights(engine: Any) -> dict[str, torch.Tensor]:
    return engine.algorithm.global_model().state_dict()


def test_two_round_fedavg_learns_and_reports(tiny_config: dict) -> None:
    rec, engine = _run(tiny_config)
    assert [r.round for r in rec.rounds] == [1, 2]
    last = rec.rounds[-1].metrics
    n_params = sum(p.numel() for p in engine.algorithm.global_model().parameters())
    # 4 clients each download and upload the full float32 model.
    assert last["round_bytes_up"] == last["round_bytes_down"] == 4 * 4 * n_params
    assert last["bytes_up"] == 2 * last["round_bytes_up"]
    assert last["seconds"] >= last["round_seconds"] > 0
    assert 0.0 <= last["accuracy"] <= 1.0 and 0.0 <= last["global_accuracy"] <= 1.0
    # Two short rounds on real data beat chance (10 classes) clearly.
    assert last["accuracy"] > 0.3, last
    assert rec.summary["accuracy"] == last["accuracy"]
    assert rec.summary["rounds"] == 2


def test_runs_are_bitwise_repeatable_in_process(tiny_config: dict) -> None:
    a, ea = _run(tiny_config)
    b, eb = _run(tiny_config)
    assert [r.metrics["train_loss"] for r in a.rounds] == [
        r.metrics["train_loss"] for r in b.rounds
    ]
    for k, v in _weights(ea).items():
        assert torch.equal(v, _weights(eb)[k]), k


def test_two_workers_match_one_worker_bitwise(tiny_config: dict) -> None:
    one, e1 = _run(tiny_config, workers=1)
    two, e2 = _run(tiny_config, workers=2)
    assert [r.metrics["accuracy"] for r in one.rounds] == [
        r.metrics["accuracy"] for r in two.rounds
    ]
    assert [r.metrics["train_loss"] for r in one.rounds] == [
        r.metrics["train_loss"] for r in two.rounds
    ]
    for k, v in _weights(e1).items():
        assert torch.equal(v, _weights(e2)[k]), k


def test_different_seeds_differ(tiny_config: dict) -> None:
    a, _ = _run(tiny_config, rounds=1)
    b, _ = _run(tiny_config, rounds=1, seed=4)
    assert a.rounds[0].metrics["train_loss"] != b.rounds[0].metrics["train_loss"]


def test_checkpoint_round_trip_continues_exactly(tiny_config: dict, tmp_path: Path) -> None:
    raw = tiny_config | {"rounds": 3, "client_fraction": 0.5, "full_last_round": True}
    straight, e_straight = _run(raw)

    cfg = validate_config(raw)
    data = build_data(cfg)
    first = build_engine(cfg, data=data)
    for result in first.iter_rounds():
        if result.round == 2:
            break
    ckpt = first.save_checkpoint(tmp_path / "ckpt.pt")

    rec = Recorder()
    resumed = build_engine(cfg, data=data, callbacks=[rec])
    resumed.load_checkpoint(ckpt)
    assert resumed.round == 2
    resumed.run()
    assert [r.round for r in rec.rounds] == [3]
    assert rec.rounds[0].client_ids == straight.rounds[2].client_ids
    assert rec.rounds[0].metrics["train_loss"] == straight.rounds[2].metrics["train_loss"]
    assert rec.rounds[0].metrics["bytes_up"] == straight.rounds[2].metrics["bytes_up"]
    for k, v in _weights(e_straight).items():
        assert torch.equal(v, _weights(resumed)[k]), k


def test_checkpoint_of_another_algorithm_is_refused(tiny_config: dict, tmp_path: Path) -> None:
    _, engine = _run(tiny_config, rounds=1)
    path = engine.save_checkpoint(tmp_path / "c.pt")
    other = build_engine(validate_config(tiny_config | {"algorithm": "local"}))
    with pytest.raises(ValueError, match="checkpoint is of 'fedavg'"):
        other.load_checkpoint(path)


def test_client_sampling_fraction_and_full_last_round(tiny_config: dict) -> None:
    rec, _ = _run(tiny_config, rounds=3, client_fraction=0.5, local_epochs=1)
    assert [len(r.client_ids) for r in rec.rounds] == [2, 2, 4]
    assert all(list(r.client_ids) == sorted(r.client_ids) for r in rec.rounds)
    rec2, _ = _run(tiny_config, rounds=2, client_fraction=0.5, full_last_round=False)
    assert [len(r.client_ids) for r in rec2.rounds] == [2, 2]


def test_eval_every_and_last_round(tiny_config: dict) -> None:
    rec, _ = _run(tiny_config, rounds=3, eval_every=2)
    evaluated = [r.round for r in rec.rounds if r.evaluated]
    assert evaluated == [2, 3]
    assert rec.rounds[0].metrics["accuracy"] is None
    assert rec.rounds[0].metrics["global_accuracy"] is None


def test_global_eval_every_thins_the_global_test_only(tiny_config: dict) -> None:
    """``global_eval_every: 2`` over 5 rounds measures ``global_accuracy`` at rounds 2, 4 and
    the last, and nothing else changes: the clients' figures and the weights are bitwise those
    of a run measuring it every round."""
    every, every_engine = _run(tiny_config, rounds=5)
    thin, thin_engine = _run(tiny_config, rounds=5, global_eval_every=2)
    measured = [r.round for r in thin.rounds if r.metrics["global_accuracy"] is not None]
    assert measured == [2, 4, 5]
    wall = {"round_seconds", "client_seconds", "seconds"}
    for a, b in zip(every.rounds, thin.rounds, strict=True):
        assert a.evaluated and b.evaluated and a.metrics["global_accuracy"] is not None
        skip = wall | ({"global_accuracy"} if b.round not in measured else set())
        for key in a.metrics.keys() - skip:
            x, y = a.metrics[key], b.metrics[key]
            assert x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)), key
    assert thin.summary is not None and every.summary is not None
    assert thin.summary["global_accuracy"] == every.summary["global_accuracy"]  # the last round's
    thin_weights = _weights(thin_engine)
    for name, w in _weights(every_engine).items():
        assert torch.equal(w, thin_weights[name]), name
    with pytest.raises(Exception, match="global_eval_every"):
        validate_config(tiny_config | {"global_eval_every": 0})


def test_local_only_uploads_nothing_and_keeps_client_models(tiny_config: dict) -> None:
    rec, engine = _run(tiny_config, algorithm="local")
    for r in rec.rounds:
        assert r.metrics["round_bytes_up"] == 0 and r.metrics["round_bytes_down"] == 0
        assert r.metrics["global_accuracy"] is None
        assert 0 <= r.metrics["accuracy"] <= 1
    assert rec.summary["global_accuracy"] is None and rec.summary["bytes_up"] == 0
    states = engine.client_states
    assert not torch.equal(states[0]["head.weight"], states[1]["head.weight"])
    assert not math.isnan(rec.rounds[-1].metrics["train_loss"])


def test_epsilon_is_inf_without_dp_and_zero_for_local(tiny_config: dict) -> None:
    rec, _ = _run(tiny_config, rounds=1)
    assert rec.rounds[0].metrics["epsilon"] == math.inf and rec.summary["epsilon"] == math.inf
    rec, _ = _run(tiny_config, rounds=1, algorithm="local")
    assert rec.rounds[0].metrics["epsilon"] == 0.0 and rec.summary["epsilon"] == 0.0


class _GlobalAfterRound(Callback):
    """Keeps a copy of the global model after each round."""

    def __init__(self, engine_ref: list) -> None:
        self.engine_ref = engine_ref
        self.models: list[dict[str, torch.Tensor]] = []

    def on_round_end(self, result: RoundResult) -> None:
        model = self.engine_ref[0].algorithm.global_model()
        self.models.append({k: v.clone() for k, v in model.state_dict().items()})


def test_fedavg_accuracy_before_is_the_received_global_model(tiny_config: dict) -> None:
    """FedAvg's ``accuracy_before`` in round 2 is round 1's global model scored on each client's
    own test set (the authors' acc1), and differs from the after-training ``accuracy``."""
    from flcore.algorithms.training import evaluate

    cfg = validate_config(tiny_config)
    ref: list = []
    keep = _GlobalAfterRound(ref)
    rec = Recorder()
    engine = build_engine(cfg, callbacks=[rec, keep])
    ref.append(engine)
    engine.run()
    model = engine.algorithm.global_model()
    model.load_state_dict(keep.models[0])
    fed = engine.data
    by_hand = [evaluate(model, fed.client_test(c), fed.info)[0] for c in range(fed.num_clients)]
    second = rec.rounds[1].metrics
    assert second["accuracy_before"] == pytest.approx(sum(by_hand) / len(by_hand), abs=1e-12)
    assert second["accuracy_before"] != second["accuracy"]
    assert rec.summary["accuracy_before"] == second["accuracy_before"]


def test_local_accuracy_before_is_last_rounds_model(tiny_config: dict) -> None:
    """Local-only keeps its model between rounds: what a client starts round r with is what it
    ended round r-1 with, so round r's ``accuracy_before`` is round r-1's ``accuracy``."""
    rec, _ = _run(tiny_config, algorithm="local", rounds=3)
    accs = [r.metrics["accuracy"] for r in rec.rounds]
    before = [r.metrics["accuracy_before"] for r in rec.rounds]
    assert before[1:] == accs[:-1]
    assert before[0] < 0.3  # round 1 starts from the untrained network


def test_accuracy_before_only_on_evaluation_rounds(tiny_config: dict) -> None:
    rec, _ = _run(tiny_config, rounds=3, eval_every=2)
    assert [r.metrics["accuracy_before"] is None for r in rec.rounds] == [True, False, False]
    # the clients' test loss is logged where it is measured, and only there
    assert ["test_loss" in r.metrics for r in rec.rounds] == [False, True, True]
    assert all(r.metrics["test_loss"] > 0 for r in rec.rounds[1:])
