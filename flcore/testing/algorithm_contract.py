"""The contract every registered algorithm must pass, on real data, in a few seconds.

tests/contract/ parametrizes these checks over ``ALGORITHMS.names()``: a new algorithm only has
to register itself to be held to them.

1. Determinism: two runs with one seed give bitwise-equal metrics and server state.
2. Checkpoint round-trip: a run restored after round 1 continues exactly as the straight run.
3. What leaves the client: ``upload`` is exactly what ``bytes_up`` counts, holds CPU tensors
   that do not alias the worker's model, and is empty when ``uploads`` is False.
4. Worker safety: ``local_update`` runs on a fresh instance that never saw ``init_server``
   (as in a spawned worker), given only the task the server built.
5. Reports: every metric in ``reports`` is measured on an evaluation round,
   ``global_accuracy`` is None exactly when the algorithm does not report it, and every scalar
   an evaluated client round returns is one the engine records (a key missing from
   ``client_metrics`` would be measured and silently dropped).
6. Evaluation is passive: the same client round with and without evaluation gives bitwise
   the same upload and private state (the before- and after-training evaluations draw no
   random numbers and touch no weights), and accuracies appear only when asked for.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from flcore.algorithms.base import ClientData, ClientTask, tensor_bytes
from flcore.callbacks import Callback, RoundResult
from flcore.config import ExperimentConfig
from flcore.data import FederatedData
from flcore.engine import Engine, recorded_client_metrics
from flcore.executor import client_generator
from flcore.experiment import build_engine

__all__ = [
    "state_equal",
    "check_determinism",
    "check_checkpoint_round_trip",
    "check_checkpoint_changes_device",
    "check_uploads",
    "check_worker_safety",
    "check_reports",
    "check_evaluation_is_passive",
]


class _Rec(Callback):
    def __init__(self) -> None:
        self.rounds: list[RoundResult] = []

    def on_round_end(self, result: RoundResult) -> None:
        self.rounds.append(result)


def _comparable(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if "seconds" not in k}


def state_equal(a: Any, b: Any) -> bool:
    """Whether two nested states (dicts, lists, tuples of tensors, arrays and plain values) are
    equal: the same structure, tensors and arrays equal element for element, NaN equal to NaN."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(state_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(state_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def _run(cfg: ExperimentConfig, data: FederatedData) -> tuple[_Rec, Engine]:
    rec = _Rec()
    engine = build_engine(cfg, data=data, callbacks=[rec])
    engine.run()
    return rec, engine


def check_determinism(cfg: ExperimentConfig, data: FederatedData) -> None:
    a, ea = _run(cfg, data)
    b, eb = _run(cfg, data)
    assert [_comparable(r.metrics) for r in a.rounds] == [_comparable(r.metrics) for r in b.rounds]
    assert state_equal(ea.algorithm.state_dict(), eb.algorithm.state_dict())
    assert state_equal(ea.client_states, eb.client_states)


def _resumed_after_one_round(
    cfg: ExperimentConfig, resume_cfg: ExperimentConfig, data: FederatedData, path: Any
) -> tuple[_Rec, Engine]:
    """One round of ``cfg`` checkpointed to ``path``, and a recorded engine of ``resume_cfg``
    restored from it (not yet run on)."""
    first = build_engine(cfg, data=data)
    rounds = first.iter_rounds()
    next(rounds)
    rounds.close()
    first.save_checkpoint(path)
    rec = _Rec()
    resumed = build_engine(resume_cfg, data=data, callbacks=[rec])
    resumed.load_checkpoint(path)
    return rec, resumed


def check_checkpoint_round_trip(cfg: ExperimentConfig, data: FederatedData, path: Any) -> None:
    straight, e_straight = _run(cfg, data)
    rec, resumed = _resumed_after_one_round(cfg, cfg, data, path)
    resumed.run()
    assert [_comparable(r.metrics) for r in rec.rounds] == [
        _comparable(r.metrics) for r in straight.rounds[1:]
    ]
    assert state_equal(resumed.algorithm.state_dict(), e_straight.algorithm.state_dict())
    assert state_equal(resumed.client_states, e_straight.client_states)


def _devices(state: Any) -> set[str]:
    """The device types of every tensor in a (nested) state."""
    if isinstance(state, torch.Tensor):
        return {state.device.type}
    if isinstance(state, dict):
        return set().union(*(_devices(v) for v in state.values()))
    if isinstance(state, list | tuple):
        return set().union(*(_devices(v) for v in state))
    return set()


def check_checkpoint_changes_device(
    cfg: ExperimentConfig, other: ExperimentConfig, data: FederatedData, path: Any
) -> None:
    """A run checkpointed on ``cfg``'s device resumes on ``other``'s (a GPU run finished on a
    CPU, or the other way round): the remaining rounds run there to the end, and on a CPU every
    tensor of the resumed state is on the CPU."""
    rec, resumed = _resumed_after_one_round(cfg, other, data, path)
    if torch.device(other.device).type == "cpu":
        assert _devices(resumed.algorithm.state_dict()) <= {"cpu"}
        assert _devices(resumed.client_states) <= {"cpu"}
    resumed.run()
    assert [r.round for r in rec.rounds] == list(range(2, cfg.rounds + 1))


def _one_task(engine: Engine, cid: int = 0) -> tuple[ClientData, ClientTask]:
    alg, fed = engine.algorithm, engine.data
    alg.begin_round(1, [cid])
    task = ClientTask(cid, 1, alg.broadcast(1, cid), engine.client_states[cid], True, engine.seed)
    data = ClientData(
        cid,
        fed.client_train(cid),
        fed.client_test(cid),
        fed.info,
        fed.client_val(cid),
        public=fed.public_set(),
    )
    return data, task


def check_uploads(cfg: ExperimentConfig, data: FederatedData) -> None:
    rec, engine = _run(cfg, data)
    alg = engine.algorithm
    for r in rec.rounds:
        if not alg.uploads:
            assert r.metrics["round_bytes_up"] == 0
    fresh = build_engine(cfg, data=data)
    cdata, task = _one_task(fresh)
    result = fresh.algorithm.local_update(cdata, task, client_generator(cfg.seed, 1, 0))
    if not alg.uploads:
        assert result.upload == {}
        return
    assert result.upload, "an uploading algorithm uploaded nothing"
    assert tensor_bytes(result.upload) > 0
    model = getattr(fresh.algorithm, "_client_model", None)
    own = {p.data_ptr() for p in model.parameters()} if model is not None else set()
    for name, t in result.upload.items():
        assert t.device.type == "cpu", name
        assert t.data_ptr() not in own, f"upload {name!r} aliases the client model"


def check_worker_safety(cfg: ExperimentConfig, data: FederatedData) -> None:
    server = build_engine(cfg, data=data)
    cdata, task = _one_task(server)
    worker = server.factory()  # a fresh instance: no init_server, as in a spawned worker
    a = worker.local_update(cdata, task, client_generator(cfg.seed, 1, 0))
    b = server.algorithm.local_update(cdata, task, client_generator(cfg.seed, 1, 0))
    assert a.metrics == b.metrics
    assert state_equal(a.upload, b.upload)


def check_reports(cfg: ExperimentConfig, data: FederatedData) -> None:
    rec, engine = _run(cfg, data)
    reports = engine.algorithm.reports
    last = rec.rounds[-1]
    assert last.evaluated
    for name in reports:
        assert last.metrics.get(name) is not None, f"{name} is declared but not measured"
    if "global_accuracy" not in reports:
        assert last.metrics["global_accuracy"] is None
    fresh = build_engine(cfg, data=data)
    cdata, task = _one_task(fresh)
    result = fresh.algorithm.local_update(cdata, task, client_generator(cfg.seed, 1, 0))
    recorded = recorded_client_metrics(engine.algorithm.client_metrics)
    dropped = sorted(result.metrics.keys() - recorded)
    assert not dropped, f"a client round returns {dropped}, which the engine never records"
    for key in engine.algorithm.client_metrics:
        assert last.metrics.get(key) is not None, f"client metric {key} is not in the round"


def check_evaluation_is_passive(cfg: ExperimentConfig, data: FederatedData) -> None:
    server = build_engine(cfg, data=data)
    cdata, task = _one_task(server)
    quiet = ClientTask(task.client_id, task.round, task.payload, task.state, False, task.seed)
    a = server.factory().local_update(cdata, task, client_generator(cfg.seed, 1, 0))
    b = server.factory().local_update(cdata, quiet, client_generator(cfg.seed, 1, 0))
    assert state_equal(a.upload, b.upload), "evaluating changed the upload"
    assert state_equal(a.state, b.state), "evaluating changed the client's private state"
    if not server.algorithm.client_evaluation:  # the server evaluates every client instead
        assert not {"accuracy", "accuracy_before"} & (a.metrics.keys() | b.metrics.keys())
        before = server.algorithm.state_dict()
        server.algorithm.evaluate_server(
            server.data, server.client_states, torch.device(cfg.device)
        )
        assert state_equal(before, server.algorithm.state_dict()), "evaluation moved the server"
        return
    assert {"accuracy", "accuracy_before"} <= a.metrics.keys()
    assert not {"accuracy", "accuracy_before"} & b.metrics.keys()
