"""PPSGD and CENTAUR on a small real FMNIST subset: what each client trains, keeps and uploads,
what the accountant composes, and what a shared-only run reports (epsilon inf, the shared
part's spend as epsilon_shared)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from flcore.algorithms import ClientData, ClientTask
from flcore.config import validate_config
from flcore.executor import client_generator
from flcore.experiment import build_data, build_engine
from flcore.privacy.accounting import compute_epsilon

DP = {"mechanism": "dpsgd", "noise_multiplier": 1.1, "clip": 1.0}


def _cfg(data_root: Path, **over):  # type: ignore[no-untyped-def]
    raw = {
        "data_root": str(data_root),
        "num_clients": 3,
        "global_test_per_class": 50,
        "samples_per_client": 100,
        "test_samples_per_client": 50,
        "rounds": 2,
        "local_epochs": 1,
        "batch_size": 25,
        "lr": 0.05,
        "workers": 1,
        "seed": 2,
        "privacy": DP,
    } | over
    return validate_config(raw)


def _one_client(cfg, data=None):  # type: ignore[no-untyped-def]
    """A fresh engine's client 0 in round 1: (engine, data, task)."""
    data = data or build_data(cfg)
    engine = build_engine(cfg, data=data)
    alg = engine.algorithm
    alg.begin_round(1, [0])
    task = ClientTask(0, 1, alg.broadcast(1, 0), engine.client_states[0], True, cfg.seed)
    cdata = ClientData(0, data.client_train(0), data.client_test(0), data.info)
    return engine, cdata, task


def _update(cfg, data=None):  # type: ignore[no-untyped-def]
    engine, cdata, task = _one_client(cfg, data)
    result = engine.algorithm.local_update(cdata, task, client_generator(cfg.seed, 1, 0))
    return task, result


def test_ppsgd_with_alpha_zero_is_dp_fedavg(data_root: Path) -> None:
    cfg = _cfg(data_root, algorithm="ppsgd", algorithm_params={"alpha": 0.0})
    data = build_data(cfg)
    _, ours = _update(cfg, data)
    _, ref = _update(_cfg(data_root, algorithm="dp_fedavg"), data)
    assert ours.upload.keys() == ref.upload.keys()
    for k in ref.upload:
        assert torch.equal(ours.upload[k], ref.upload[k]), k
    assert all(torch.count_nonzero(t) == 0 for t in ours.state.values())


def test_ppsgd_personal_part_takes_alpha_times_the_global_step(data_root: Path) -> None:
    """Same private gradient for both parts: with weight decay 0, theta_i = alpha (w_i - w)."""
    alpha = 2.5
    cfg = _cfg(
        data_root,
        algorithm="ppsgd",
        algorithm_params={"alpha": alpha},
        optimizer={"name": "sgd", "momentum": 0.5, "weight_decay": 0.0},
    )
    task, result = _update(cfg)
    moved = 0.0
    for k, theta in result.state.items():
        step = result.upload[k] - task.payload[k]
        torch.testing.assert_close(theta, alpha * step, rtol=1e-4, atol=1e-6)
        moved += float(step.abs().sum())
    assert moved > 0
    # what leaves the client is the global part only: theta is not in the upload
    assert set(result.upload) == set(task.payload)


def test_ppsgd_keeps_theta_across_rounds_and_accounts_like_dp_fedavg(data_root: Path) -> None:
    cfg = _cfg(data_root, algorithm="ppsgd", algorithm_params={"alpha": 1.0})
    engine = build_engine(cfg)
    assert engine.algorithm.dp_guarantee() == "isrl"
    results = list(engine.iter_rounds())
    thetas = engine.client_states
    assert all(any(torch.count_nonzero(t) for t in thetas[c].values()) for c in range(3))
    # 2 rounds x 1 epoch x ceil(100 / 25) steps at q = 1/4 for every client
    expected = compute_epsilon([(1.1, 0.25, 8)], 1e-5)
    assert results[-1].metrics["epsilon"] == pytest.approx(expected)
    # fully ISRL-DP: the private steps are everything, so the shared part spent epsilon
    assert results[-1].metrics["epsilon_shared"] == results[-1].metrics["epsilon"]
    assert results[-1].metrics["global_accuracy"] is not None


def test_centaur_uploads_the_representation_and_keeps_the_head(data_root: Path) -> None:
    cfg = _cfg(data_root, algorithm="centaur", algorithm_params={"head_epochs": 0})
    task, result = _update(cfg)
    assert set(result.upload) == set(task.payload)
    assert all(k.startswith("features.") for k in result.upload)
    assert all(k.startswith("head.") for k in result.state)
    # head_epochs 0: the head is frozen while the representation trains
    for k, v in result.state.items():
        assert torch.equal(v, task.state[k]), k
    assert any(not torch.equal(result.upload[k], task.payload[k]) for k in task.payload)


def test_centaur_head_phase_leaves_the_representation_alone(data_root: Path) -> None:
    cfg = _cfg(data_root, algorithm="centaur", local_epochs=1, algorithm_params={"head_epochs": 2})
    engine, cdata, task = _one_client(cfg)
    alg = engine.algorithm
    model = alg.client_model()
    seen = {}
    original = alg.train_local

    def spy(model, data, generator, **kw):  # type: ignore[no-untyped-def]
        before = {k: v.clone() for k, v in model.state_dict().items()}
        loss = original(model, data, generator, **kw)
        after = model.state_dict()
        changed = {k for k in before if not torch.equal(before[k], after[k])}
        seen[kw.get("epochs")] = changed
        return loss

    alg.train_local = spy  # type: ignore[method-assign]
    alg.local_update(cdata, task, client_generator(cfg.seed, 1, 0))
    assert seen[2] and all(k.startswith("head.") for k in seen[2])  # head phase
    assert seen[None] and all(k.startswith("features.") for k in seen[None])  # representation
    assert all(p.requires_grad for p in model.parameters())  # nothing left frozen


def test_centaur_accounts_for_the_head_steps_unless_told_not_to(data_root: Path) -> None:
    cfg = _cfg(data_root, algorithm="centaur", algorithm_params={"head_epochs": 1})
    engine = build_engine(cfg)
    assert engine.algorithm.dp_guarantee() == "isrl"
    summary = engine.run()
    # (1 head + 1 representation epoch) x ceil(100/25) steps, 2 rounds
    assert summary["epsilon"] == pytest.approx(compute_epsilon([(1.1, 0.25, 16)], 1e-5))
    assert summary["epsilon_shared"] == summary["epsilon"]
    assert summary["global_accuracy"] is None

    weak = _cfg(
        data_root,
        algorithm="centaur",
        algorithm_params={"head_epochs": 1, "personal_dp": False},
    )
    engine = build_engine(weak)
    assert engine.algorithm.dp_guarantee() == "shared-only"
    results = list(engine.iter_rounds())
    summary = engine.summary()
    # no formal guarantee: epsilon is inf, in every round; the representation steps' spend
    # is epsilon_shared
    assert summary["epsilon"] == math.inf
    assert all(r.metrics["epsilon"] == math.inf for r in results)
    assert summary["epsilon_shared"] == pytest.approx(compute_epsilon([(1.1, 0.25, 8)], 1e-5))


def test_calibration_counts_every_dp_epoch(data_root: Path) -> None:
    target = {"mechanism": "dpsgd", "target_epsilon": 4.0, "clip": 1.0}
    sig = {}
    for alg, params in [("dp_fedavg", {}), ("centaur", {"head_epochs": 2})]:
        cfg = _cfg(data_root, algorithm=alg, privacy=target, algorithm_params=params)
        engine = build_engine(cfg)
        sig[alg] = engine.algorithm.privacy.noise_multiplier
        steps = 2 * engine.algorithm.dp_epochs(1, engine.algorithm.params) * 4
        assert compute_epsilon([(sig[alg], 0.25, steps)], 1e-5) <= 4.0
        assert compute_epsilon([(0.95 * sig[alg], 0.25, steps)], 1e-5) > 4.0
    assert sig["centaur"] > sig["dp_fedavg"]  # 3 epochs per round need more noise than 1


def test_dp_guarantee_of_the_other_algorithms(data_root: Path) -> None:
    assert (
        build_engine(_cfg(data_root, algorithm="fedavg", privacy=None)).algorithm.dp_guarantee()
        == "none"
    )
    assert (
        build_engine(_cfg(data_root, algorithm="local", privacy=None)).algorithm.dp_guarantee()
        == "no-release"
    )
    client = {"mechanism": "client", "noise_multiplier": 1.0, "clip": 1.0}
    eng = build_engine(_cfg(data_root, algorithm="dp_fedavg_client", privacy=client))
    assert eng.algorithm.dp_guarantee() == "client-level"


def test_ppsgd_without_personal_dp_steps_theta_with_the_clean_gradient(data_root: Path) -> None:
    """personal_dp false (the paper's local step): theta_i no longer follows the private step
    of w, the upload is still w only, and the run is labelled shared-only."""
    params = {"alpha": 1.0, "personal_dp": False}
    cfg = _cfg(
        data_root,
        algorithm="ppsgd",
        algorithm_params=params,
        optimizer={"name": "sgd", "momentum": 0.0, "weight_decay": 0.0},
        privacy={"mechanism": "dpsgd", "noise_multiplier": 50.0, "clip": 1.0},
    )
    task, result = _update(cfg)
    assert set(result.upload) == set(task.payload)
    # with huge noise the private step of w is mostly noise; theta's clean step is not
    gap = sum(
        float((result.state[k] - (result.upload[k] - task.payload[k])).abs().sum())
        for k in result.state
    )
    assert gap > 0
    engine = build_engine(cfg)
    assert engine.algorithm.dp_guarantee() == "shared-only"
    summary = engine.run()
    assert summary["epsilon"] == math.inf  # no formal guarantee
    # theta costs nothing in the accountant's eyes: the global part's steps, as the default's
    assert summary["epsilon_shared"] == pytest.approx(compute_epsilon([(50.0, 0.25, 8)], 1e-5))


def test_ppsgd_clean_theta_step_is_plain_sgd_on_the_batch(data_root: Path) -> None:
    """With sigma = 0 and a clip too large to bind, private and clean gradients coincide, so
    personal_dp makes no difference to the result."""
    base = {
        "algorithm": "ppsgd",
        "optimizer": {"name": "sgd", "momentum": 0.0, "weight_decay": 0.0},
        "privacy": {"mechanism": "dpsgd", "noise_multiplier": 0.0, "clip": 1e6},
    }
    data = build_data(_cfg(data_root, **base))
    out = {}
    for flag in (True, False):
        cfg = _cfg(data_root, **base, algorithm_params={"alpha": 1.0, "personal_dp": flag})
        out[flag] = _update(cfg, data)[1]
    for k in out[True].state:
        torch.testing.assert_close(out[False].state[k], out[True].state[k], rtol=1e-3, atol=1e-6)
        torch.testing.assert_close(out[False].upload[k], out[True].upload[k], rtol=1e-4, atol=1e-6)
