"""The contracts of the privacy evaluation, for every algorithm and every attack.

tests/contract/ parametrizes these over ``ALGORITHMS.names()`` and ``ATTACKS.names()``.

For algorithms: the observation an attack is handed holds only what the server sees. Its
tensors (the upload, the broadcast, everything the surface carries) are compared with the
client's private state at that round (the state the engine keeps for it, after a round of
training, so it has left its public initial value): none may equal one of them or share its
memory. The upload must be exactly what the replayed ``local_update`` sent, and the surface must
simulate it: its gradient has the uploaded tensors' names and shapes. Under the default
evaluation every algorithm's attacker is given the true labels (one threat model for all). An
algorithm that uploads nothing has no surface and reports ``nothing uploaded``.

For attacks: on a real one-record FedAvg observation, ``reconstruct`` returns one ``[0, 1]``
image of the record's shape and a label, says where the label came from, and is repeatable.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from flcore.algorithms.base import ClientTask
from flcore.attacks import ATTACKS
from flcore.attacks.base import Observation
from flcore.attacks.evaluation import NOTHING_UPLOADED, LeakageEvaluator
from flcore.config import ExperimentConfig
from flcore.data import FederatedData
from flcore.engine import Engine
from flcore.experiment import build_engine

__all__ = ["check_observation_is_the_servers_view", "check_attack_contract", "observations"]


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from _tensors(v)
    elif isinstance(obj, nn.Module):
        yield from obj.state_dict().values()


def _surface_tensors(surface: Any) -> Iterator[torch.Tensor]:
    for name, value in vars(surface).items():
        if not name.startswith("__"):
            yield from _tensors(value)


def observations(
    cfg: ExperimentConfig, data: FederatedData, client: int = 0, train_rounds: int = 1
) -> tuple[Engine, ClientTask, list[Observation], LeakageEvaluator]:
    """Train ``train_rounds`` rounds, then replay ``client``'s next update on one record and
    return the engine, that round's task and what the server sees of the replayed upload."""
    from flcore.algorithms import ALGORITHMS

    r = train_rounds + 1
    raw = cfg.model_dump(mode="json") | {"rounds": max(cfg.rounds, r)}
    if ALGORITHMS.get(cfg.algorithm).topology == "walk":  # one client a step: no fraction
        raw = {k: v for k, v in raw.items() if k not in ("client_fraction", "full_last_round")}
    else:
        raw["client_fraction"] = 1.0
    raw = raw | {
        "attack": {"name": "ig", "rounds": [r], "clients": [client], "images": 1, "iterations": 1}
    }
    from flcore.config import validate_config

    cfg = validate_config(raw)
    engine = build_engine(cfg, data=data)
    evaluator = engine.probes[0]
    engine.probes = []  # round 1 trains without an attack
    rounds = engine.iter_rounds()
    for _ in range(train_rounds):
        next(rounds)
    rounds.close()
    alg = engine.algorithm
    alg.begin_round(r, [client])
    payload = alg.broadcast(r, client)
    task = ClientTask(client, r, payload, engine.client_states[client], False, cfg.seed)
    if not alg.uploads:
        return engine, task, [], evaluator
    obs, _ = evaluator.observe(engine, r, task)
    return engine, task, obs, evaluator


def check_observation_is_the_servers_view(cfg: ExperimentConfig, data: FederatedData) -> None:
    engine, task, obs, evaluator = observations(cfg, data)
    alg = engine.algorithm
    if not alg.uploads:
        assert alg.attack_surface(task.payload, task.client_id) is None
        assert evaluator.summary(engine)["leak_reason"] == NOTHING_UPLOADED
        return
    assert len(obs) == 1
    o = obs[0]
    # one threat model for every algorithm: by default the attacker is given the true labels
    assert not o.recover_labels and o.labels is not None, f"{alg.name}: labels not given"
    private = [t for t in _tensors(task.state) if t.numel() > 1]
    seen = [
        *_tensors(dict(o.upload)),
        *_tensors(dict(o.broadcast)),
        *_surface_tensors(o.surface),
    ]
    for p in private:
        for t in seen:
            assert t.data_ptr() != p.data_ptr() or t.numel() == 0, "shares a private tensor"
            if t.shape == p.shape:
                assert not torch.equal(t, p), f"{alg.name}: a private tensor reached the server"
    # the upload is what the algorithm sent, and the surface simulates exactly those tensors
    assert set(o.surface.start) <= set(o.upload)
    x = torch.zeros((1, *o.image_shape))
    grads = o.surface.gradient(o.surface.unknowns, x, torch.zeros(1, dtype=torch.long))
    assert set(grads) == set(o.surface.start)
    for k, g in grads.items():
        assert g.shape == o.surface.start[k].shape, k
    target = o.target()
    assert set(target) == set(o.surface.start)
    assert any(float(v.abs().sum()) > 0 for v in target.values()), "the upload moved nothing"


def check_attack_contract(name: str, obs: Observation) -> None:
    device = str(next(iter(obs.surface.start.values())).device)  # where the run trained
    params = {"iterations": 3, "seed": 1}
    a = ATTACKS.create(name, params=params, device=device).reconstruct(obs)
    b = ATTACKS.create(name, params=params, device=device).reconstruct(obs)
    assert a.images.shape == (obs.num_records, *obs.image_shape)
    assert float(a.images.min()) >= 0.0 and float(a.images.max()) <= 1.0
    assert a.label_source in ("given", "idlg")
    assert a.labels.numel() == obs.num_records
    assert torch.equal(a.images, b.images), "not repeatable with a fixed seed"
