"""The meta-learning family on real FMNIST few-shot tasks: graphs and walks, the task builder,
LoDMeta's wire format, clipping and noise, its epsilons, learning, checkpoints, bad input."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from flcore.algorithms.meta.graph import (
    build_graph,
    stationary_distribution,
    transition_matrix,
)
from flcore.algorithms.meta.maml import adapted_accuracy, meta_gradient, tensors
from flcore.callbacks import Callback
from flcore.config import validate_config
from flcore.data.fewshot import FewShotSpec, build_fewshot_data
from flcore.errors import ConfigError
from flcore.executor import client_generator
from flcore.experiment import build_data, build_engine
from flcore.privacy.accounting import RDP_ORDERS
from flcore.privacy.perturbation import network_dp_epsilon
from flcore.testing.algorithm_contract import _one_task


class _Rec(Callback):
    def __init__(self) -> None:
        self.rounds: list[dict] = []

    def on_round_end(self, result) -> None:  # type: ignore[no-untyped-def]
        self.rounds.append(result.metrics)


def _raw(data_root: Path, algorithm: str = "lodmeta", **extra: object) -> dict:  # type: ignore[type-arg]
    raw = {
        "algorithm": algorithm,
        "dataset": "fmnist",
        "data_root": str(data_root),
        "model": "conv4",
        "model_params": {"hidden": 16},
        "num_clients": 6,
        "rounds": 4,
        "lr": 0.001,
        "eval_every": 2,
        "seed": 1,
        "workers": 1,
        "fewshot": {"n_way": 5, "k_shot": 2, "query": 4, "test_query": 4, "unseen_clients": 2},
        "graph": {"name": "regular", "degree": 3},
        "algorithm_params": {"inner_steps": 2, "inner_lr": 0.1},
    }
    return raw | extra


# ----------------------------------------------------------------------------- graphs and walks


def test_a_long_walk_visits_clients_as_its_stationary_distribution() -> None:
    # Prepare: a small world (irregular degrees) and the simple walk: pi_i = deg(i) / 2|E|
    g = build_graph("watts_strogatz", 12, seed=3, k=4, p=0.5)
    degrees = np.array([g.degree(i) for i in range(12)])
    assert len(set(degrees)) > 1  # irregular: the test can tell uniform from degree-weighted
    rng = np.random.default_rng(0)
    # Execute
    pos, counts = g.start(rng), np.zeros(12)
    for _ in range(60_000):
        pos = g.step(pos, rng)
        counts[pos] += 1
    # Assert
    pi = degrees / degrees.sum()
    np.testing.assert_allclose(stationary_distribution(g.transition), pi, atol=1e-9)
    np.testing.assert_allclose(counts / counts.sum(), pi, atol=0.01)


def test_metropolis_hastings_is_uniform_on_an_irregular_graph() -> None:
    g = build_graph("watts_strogatz", 12, seed=3, k=4, p=0.5, walk="metropolis")
    np.testing.assert_allclose(
        stationary_distribution(g.transition), np.full(12, 1 / 12), atol=1e-9
    )
    rng = np.random.default_rng(1)
    pos, counts = 0, np.zeros(12)
    for _ in range(60_000):
        pos = g.step(pos, rng)
        counts[pos] += 1
    np.testing.assert_allclose(counts / counts.sum(), np.full(12, 1 / 12), atol=0.01)
    # the rows are probabilities and only neighbours (or staying) have mass
    np.testing.assert_allclose(g.transition.sum(1), 1.0)
    for i in range(12):
        off = set(np.flatnonzero(g.transition[i])) - {i}
        assert off <= set(g.neighbours[i])


def test_the_transition_matrix_and_sigma2_by_hand() -> None:
    # a path 0 - 1 - 2: P = [[0, 1, 0], [1/2, 0, 1/2], [0, 1, 0]], eigenvalues 1, 0, -1
    a = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=float)
    np.testing.assert_allclose(
        transition_matrix(a, "simple"), [[0, 1, 0], [0.5, 0, 0.5], [0, 1, 0]]
    )
    from flcore.algorithms.meta.graph import second_eigenvalue_modulus

    assert second_eigenvalue_modulus(transition_matrix(a, "simple")) == pytest.approx(1.0)
    mh = transition_matrix(a, "metropolis")  # min(1/1, 1/2) = 1/2 on each edge
    np.testing.assert_allclose(mh, [[0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]])


def test_a_disconnected_edge_list_is_refused_at_the_edge(data_root: Path, tmp_path: Path) -> None:
    edges = tmp_path / "edges.txt"
    edges.write_text("# two triangles\n0 1\n1 2\n2 0\n3 4\n4 5\n5 3\n")
    with pytest.raises(ConfigError, match="disconnected"):
        validate_config(_raw(data_root, graph={"name": "edges", "path": str(edges)}))
    edges.write_text("0 1\n1 2\n2 3\n3 4\n4 5\n5 0\n")  # a ring: fine
    validate_config(_raw(data_root, graph={"name": "edges", "path": str(edges)}))


def test_a_random_graph_drawn_disconnected_is_refused_at_config_time(data_root: Path) -> None:
    # a 2-regular graph is a union of cycles: with seed 0 on 6 clients, more than one (the
    # draw the run would make is made at config time); seed 1 draws one 6-cycle
    with pytest.raises(ConfigError, match="regular graph is disconnected"):
        validate_config(_raw(data_root, graph={"name": "regular", "degree": 2}, seed=0))
    validate_config(_raw(data_root, graph={"name": "regular", "degree": 2}, seed=1))


def test_the_perturbation_clip_defaults_to_the_measured_m(data_root: Path) -> None:
    from flcore.config import PERTURBATION_CLIP

    privacy = {"mechanism": "perturbation", "release_epsilon": 0.5}
    assert validate_config(_raw(data_root, privacy=privacy)).privacy.clip == PERTURBATION_CLIP
    assert PERTURBATION_CLIP == 0.6  # BENCHMARKS.md: median measured norm 0.627
    given = validate_config(_raw(data_root, privacy=privacy | {"clip": 2.0}))
    assert given.privacy.clip == 2.0
    from flcore.config import PrivacyConfig

    assert PrivacyConfig(mechanism="dpsgd", noise_multiplier=1.0).clip == 0.04  # as before


# ----------------------------------------------------------------------------- few-shot tasks


def test_tasks_are_disjoint_shaped_and_unseen_clients_use_meta_test_classes(fmnist) -> None:  # type: ignore[no-untyped-def]
    spec = FewShotSpec(5, 3, 15, 15, (0, 1, 2, 3, 4), (5, 6, 7, 8, 9), unseen_clients=4)
    data = build_fewshot_data(fmnist, spec, num_clients=8, seed=2)
    seen: set[int] = set()
    labels = fmnist.train.labels.numpy()
    for c in range(8):
        parts = [
            data.train.client_indices[c],
            data.val.client_indices[c],
            data.test.client_indices[c],
        ]
        for part, per in zip(parts, (3, 15, 15), strict=True):
            assert part.size == 5 * per
            assert set(labels[part]) <= {0, 1, 2, 3, 4}
            assert np.bincount(labels[part], minlength=10)[:5].tolist() == [per] * 5
        mine = set(np.concatenate(parts).tolist())
        assert len(mine) == 5 * 33 and not mine & seen  # disjoint within and across clients
        seen |= mine
        support = data.client_train(c)
        assert support.images.shape == (15, 1, 28, 28)
        assert sorted(support.labels.tolist()) == sorted([0, 1, 2, 3, 4] * 3)
    # each client has its own class-to-label permutation
    assert len({tuple(m[:5]) for m in data.label_maps}) > 1
    for j in range(4):
        ids = np.concatenate(
            [data.unseen_support.client_indices[j], data.unseen_test.client_indices[j]]
        )
        assert set(labels[ids]) <= {5, 6, 7, 8, 9} and not set(ids.tolist()) & seen
        assert data.unseen_train(j).labels.unique().tolist() == [0, 1, 2, 3, 4]
    assert data.info.num_classes == 5


def test_too_few_records_for_the_tasks_is_refused(data_root: Path) -> None:
    cfg = validate_config(
        _raw(data_root, fewshot={"n_way": 5, "k_shot": 3000, "unseen_clients": 0})
    )
    with pytest.raises(ConfigError, match="too few records"):
        build_data(cfg)


# ----------------------------------------------------------------------------- LoDMeta


def _client_round(data_root: Path, algorithm: str, **extra: object):  # type: ignore[no-untyped-def]
    engine = build_engine(validate_config(_raw(data_root, algorithm, **extra)))
    data, task = _one_task(engine)
    result = engine.algorithm.local_update(data, task, client_generator(1, 1, 0))
    return engine, data, task, result


def test_only_w_crosses_the_wire_for_lodmeta(data_root: Path) -> None:
    engine, _, _, result = _client_round(data_root, "lodmeta")
    names = {k for k, _ in engine.algorithm.net().named_parameters()}
    assert set(result.upload) == {f"w.{k}" for k in names}
    assert result.state is not None and set(result.state) == {"m", "v"}  # kept by the client
    _, _, _, basic = _client_round(data_root, "lodmeta_basic")
    assert set(basic.upload) == {f"{p}.{k}" for p in "wmv" for k in names}
    assert basic.state is None


def test_bytes_and_communication_units_per_step(data_root: Path) -> None:
    out = {}
    for alg in ("lodmeta", "lodmeta_basic", "lodmeta_sgd"):
        rec = _Rec()
        build_engine(validate_config(_raw(data_root, alg, rounds=2)), callbacks=[rec]).run()
        out[alg] = rec.rounds[-1]
    model_bytes = out["lodmeta"]["round_bytes_up"]
    assert out["lodmeta_basic"]["round_bytes_up"] == 3 * model_bytes
    assert out["lodmeta_sgd"]["round_bytes_up"] == model_bytes
    assert [out[a]["comm_units"] for a in out] == [2.0, 6.0, 2.0]


def test_the_baselines_communication_units_are_table_1s(data_root: Path) -> None:
    """LoDMeta's Table 1: MAML and FedAlt 2n a round (n active clients: each downloads and
    uploads the model), L2C 3 a round; the bytes are the run's own."""
    units = {}
    for alg, extra in (
        ("fedmaml", {"clients_per_round": 3}),
        ("fedalt", {"clients_per_round": 2, "local_steps": 1}),
    ):
        rec = _Rec()
        params = {"inner_steps": 1, "inner_lr": 0.1} | extra
        raw = _raw(data_root, alg, rounds=2, graph=None, algorithm_params=params)
        build_engine(validate_config(raw), callbacks=[rec]).run()
        units[alg] = [r["comm_units"] for r in rec.rounds]
        assert rec.rounds[-1]["round_bytes_up"] > 0  # bytes are measured beside the units
    rec = _Rec()
    build_engine(validate_config(_l2c(data_root) | {"rounds": 2}), callbacks=[rec]).run()
    units["l2c"] = [r["comm_units"] for r in rec.rounds]
    assert units == {"fedmaml": [6.0, 12.0], "fedalt": [4.0, 8.0], "l2c": [3.0, 6.0]}


def test_clipping_bounds_the_released_meta_gradient(data_root: Path) -> None:
    # sigma 0: the released gradient is the clipped one; theta 0: m is that gradient
    privacy = {"mechanism": "perturbation", "noise_multiplier": 0.0, "clip": 0.05, "delta": 1e-5}
    _, data, task, result = _client_round(data_root, "lodmeta", privacy=privacy)
    m = result.state["m"]
    norm = math.sqrt(sum(float(v.pow(2).sum()) for v in m.values()))
    assert result.metrics["meta_grad_norm"] > 0.05  # the clip binds
    assert norm == pytest.approx(0.05, rel=1e-4)


def test_v_never_sees_a_clean_gradient(data_root: Path) -> None:
    privacy = {"mechanism": "perturbation", "noise_multiplier": 2.0, "clip": 0.5, "delta": 1e-5}
    engine, data, task, result = _client_round(data_root, "lodmeta", privacy=privacy)
    p = engine.algorithm.params
    clean, _ = meta_gradient(
        engine.algorithm.net(),
        engine.algorithm.take(task.payload, "w."),
        tensors(data.train, data.info, torch.device("cpu")),
        tensors(data.val, data.info, torch.device("cpu")),
        steps=p.inner_steps,
        lr=p.inner_lr,
        first_order=p.first_order,
    )
    m, v = result.state["m"], result.state["v"]
    for k in m:
        # v is built from the same noisy gradient as m (theta 0: m is it), never the clean one
        torch.testing.assert_close(v[k], (1 - p.beta) * m[k].pow(2))
    noise = torch.cat([(m[k] - clean[k]).flatten() for k in m])
    assert float(noise.std()) == pytest.approx(2 * 2.0 * 0.5, rel=0.05)  # std 2 z M
    # Algorithm 2 as printed: v from the clean gradient (and no guarantee)
    engine2, data2, task2, exact = _client_round(
        data_root,
        "lodmeta",
        privacy=privacy,
        algorithm_params={"inner_steps": 2, "paper_exact": True},
    )
    for k in exact.state["v"]:
        torch.testing.assert_close(exact.state["v"][k], (1 - p.beta) * clean[k].pow(2))
    assert engine2.algorithm.privacy_tags()["dp_guarantee"] == "none"
    # nothing clipped, v clean: no figure of the accountant describes this release
    metrics = engine2.algorithm.privacy_metrics()
    assert metrics["epsilon"] == metrics["epsilon_accountant"] == math.inf


def test_a_noisy_walk_is_the_same_walk_at_any_clip_that_binds(data_root: Path) -> None:
    # The noise is 2 z M and the clipped gradient has norm M, so both scale with M, and
    # m / sqrt(v + lambda) does not (lambda negligible): where the clip binds at every step, the
    # walk's weights are the same at every M, and no choice of M buys signal per unit of noise
    # (BENCHMARKS.md, Tables 2-3's grid).
    walks, norms = [], []
    for clip in (0.01, 0.001):
        privacy = {
            "mechanism": "perturbation",
            "noise_multiplier": 1.0,
            "clip": clip,
            "delta": 1e-5,
        }
        raw = _raw(data_root, privacy=privacy, rounds=6, eval_every=6)
        raw["algorithm_params"] = raw["algorithm_params"] | {"lam": 1e-30}
        rec = _Rec()
        engine = build_engine(validate_config(raw), callbacks=[rec])
        engine.run()
        walks.append({k: v.clone() for k, v in engine.algorithm.w.items()})
        norms += [r["meta_grad_norm"] for r in rec.rounds]
    assert min(norms) > 0.01  # the clip binds at every step of both walks
    init = build_engine(validate_config(_raw(data_root))).algorithm.w
    assert any(not torch.equal(walks[0][k], init[k]) for k in init)  # the walk moved
    for k in walks[0]:
        torch.testing.assert_close(walks[0][k], walks[1][k], rtol=1e-4, atol=1e-6)


def test_epsilon_is_the_accountant_over_visits_and_epsilon_paper_theorem_4_5(
    data_root: Path,
) -> None:
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    # Prepare / Execute: 12 steps at the per-release epsilon 0.5, delta 1e-3 (records a client
    # trains on: 5 x (2 + 4) = 30, so 1e-3 < 1/30)
    privacy = {"mechanism": "perturbation", "release_epsilon": 0.5, "delta": 1e-3, "clip": 1.0}
    rec = _Rec()
    engine = build_engine(
        validate_config(_raw(data_root, privacy=privacy, rounds=12)), callbacks=[rec]
    )
    engine.run()
    alg = engine.algorithm
    z = math.sqrt(2 * math.log(1.25 / 1e-3)) / 0.5  # the classic formula
    assert alg.privacy.noise_multiplier == pytest.approx(z)
    # Assert: the worst client's visits, each a Gaussian release at z, composed by the library
    most = max(alg.visits)
    assert sum(alg.visits) == 12 and most >= 2
    lib = rdp_privacy_accountant.RdpAccountant(orders=RDP_ORDERS)
    lib.compose(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(z), most))
    last = rec.rounds[-1]
    assert last["epsilon"] == pytest.approx(lib.get_epsilon(1e-3), rel=1e-6)
    assert alg.privacy_tags() == {"dp_guarantee": "client-ldp", "dp_relation": "replace-one"}
    # Theorem 4.5 by hand for T = 12, n = 6, delta = delta_hat = 1e-3:
    # N_u = 12/6 + sqrt(3 x 12 x ln(1000) / 6) = 2 + 6.4394 = 8.4394; q = max(16.879, 13.816)
    # eps' = sqrt(2 q ln(1/delta)) x 0.5 / sqrt(ln(1250)) = 15.2702 x 0.5 / 2.6706 = 2.8590
    assert last["epsilon_paper"] == pytest.approx(2.8590, abs=2e-4)
    assert last["epsilon_paper"] == pytest.approx(
        network_dp_epsilon(0.5, 1e-3, steps=12, num_clients=6, delta_hat=1e-3)
    )


def test_a_weak_delta_stands_at_infinity_with_a_warning(data_root: Path) -> None:
    privacy = {"mechanism": "perturbation", "release_epsilon": 0.5, "delta": 0.3, "clip": 1.0}
    with pytest.warns(UserWarning, match="weak-delta"):
        engine = build_engine(validate_config(_raw(data_root, privacy=privacy, rounds=2)))
    engine.run()
    metrics = engine.algorithm.privacy_metrics()
    assert engine.algorithm.privacy_tags()["dp_guarantee"] == "weak-delta"
    assert metrics["epsilon"] == math.inf and math.isfinite(metrics["epsilon_accountant"])


def test_meta_training_beats_the_untrained_initialisation(data_root: Path) -> None:
    # Prepare: the 200 steps, on 6 clients, 5-way 2-shot, CONV4 of width 16, first
    # order (the test's budget); the reference is the untrained network adapted the same way
    # (FMNIST's 5-way tasks are easy enough that it is far above chance)
    raw = _raw(
        data_root,
        rounds=200,
        eval_every=200,
        lr=0.003,
        algorithm_params={"inner_steps": 3, "inner_lr": 0.1, "first_order": True},
    )
    rec = _Rec()
    engine = build_engine(validate_config(raw), callbacks=[rec])
    alg, data = engine.algorithm, engine.data
    start = alg.initial_params()
    before = np.mean(
        [
            adapted_accuracy(
                alg.net(),
                start,
                tensors(data.client_train(c), data.info, torch.device("cpu")),
                tensors(data.client_test(c), data.info, torch.device("cpu")),
                steps=3,
                lr=0.1,
            )
            for c in range(6)
        ]
    )
    # Execute
    engine.run()
    # Assert
    after = rec.rounds[-1]["accuracy"]
    assert after > 0.2 and after > before + 0.05, (before, after)
    assert rec.rounds[-1]["unseen_accuracy"] > 0.2
    assert 0 < rec.rounds[-1]["graph_sigma2"] < 1


def test_checkpoint_mid_walk_keeps_position_and_every_visited_clients_m_and_v(
    data_root: Path, tmp_path: Path
) -> None:
    cfg = validate_config(_raw(data_root, rounds=8, eval_every=8))
    straight = build_engine(cfg)
    straight.run()
    first = build_engine(cfg)
    rounds = first.iter_rounds()
    for _ in range(4):
        next(rounds)
    rounds.close()
    first.save_checkpoint(tmp_path / "c.pt")
    visited = {c for c, s in first.client_states.items() if s is not None}
    assert visited and all(set(first.client_states[c]) == {"m", "v"} for c in visited)
    resumed = build_engine(cfg)
    resumed.load_checkpoint(tmp_path / "c.pt")
    assert resumed.algorithm.position == first.algorithm.position
    resumed.run()
    assert resumed.algorithm.position == straight.algorithm.position
    for k, v in straight.algorithm.w.items():
        torch.testing.assert_close(resumed.algorithm.w[k], v, rtol=0, atol=0)
    for c, s in straight.client_states.items():
        if s is None:
            assert resumed.client_states[c] is None
        else:
            for part in ("m", "v"):
                for k in s[part]:
                    torch.testing.assert_close(resumed.client_states[c][part][k], s[part][k])


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (
            {"privacy": {"mechanism": "perturbation", "release_epsilon": 0.0, "clip": 1.0}},
            "privacy",
        ),
        (
            {"privacy": {"mechanism": "perturbation", "release_epsilon": 1.5, "clip": 1.0}},
            "privacy",
        ),
        (
            {"privacy": {"mechanism": "perturbation", "noise_multiplier": 1.0, "delta": 0.5}},
            "privacy",
        ),
        (
            {"privacy": {"mechanism": "perturbation", "noise_multiplier": 1.0, "clip": 0.0}},
            "privacy.clip",
        ),
        ({"client_fraction": 0.5}, "client_fraction"),
        ({"full_last_round": False}, "full_last_round"),
        ({"graph": None}, "graph"),
        ({"fewshot": None}, "fewshot"),
        ({"num_clients": 7}, "graph.degree"),  # 7 clients x 3 neighbours is odd: no 3-regular
    ],
)
def test_bad_input_is_refused_before_any_work(data_root: Path, change: dict, key: str) -> None:  # type: ignore[type-arg]
    raw = _raw(data_root) | change
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_config(raw)


def test_server_algorithms_refuse_a_graph_and_plain_ones_refuse_fewshot(data_root: Path) -> None:
    with pytest.raises(ConfigError, match="graph"):
        validate_config(_raw(data_root, "fedmaml"))
    raw = _raw(data_root, "fedavg", graph=None, algorithm_params={})
    with pytest.raises(ConfigError, match="fewshot"):
        validate_config(raw)


# ----------------------------------------------------------------------------- L2C and scoring


def _l2c(data_root: Path, **params: object) -> dict:  # type: ignore[type-arg]
    p = {"inner_lr": 0.1, "local_steps": 1, "prune_after": 2, "top_k": 1} | params
    return _raw(data_root, "l2c", rounds=4, eval_every=4, algorithm_params=p)


def test_l2c_receives_only_the_neighbours_it_keeps_after_t0(data_root: Path) -> None:
    rec = _Rec()
    engine = build_engine(validate_config(_l2c(data_root)), callbacks=[rec])
    engine.run()
    alg = engine.algorithm
    model_bytes = sum(4 * v.numel() for v in alg.net().parameters())
    down = [r["round_bytes_down"] for r in rec.rounds]
    up = [r["round_bytes_up"] for r in rec.rounds]
    clients = engine.data.num_clients
    # round 1 receives nothing; round 2 (T_0) every neighbour's model, then decides; from
    # round 3 each client receives the model of the one neighbour it keeps
    assert down == [0.0, 3 * clients * model_bytes, clients * model_bytes, clients * model_bytes]
    # each client uploads its model, and at T_0 its kept neighbour's id (one int64) once
    assert up == [clients * model_bytes, clients * (model_bytes + 8), *[clients * model_bytes] * 2]
    for cid in range(clients):
        keep = engine.client_states[cid]["keep"]
        assert alg.keep[cid] == keep[1:] and len(keep) == 2 and keep[0] == cid
        assert set(alg.senders(cid)) == set(keep[1:])
        assert set(alg.graph.neighbours[cid]) >= set(keep[1:])
    # L2C makes no model for a client that never trained: no unseen accuracy
    assert rec.rounds[-1]["unseen_accuracy"] is None and rec.rounds[-1]["accuracy"] > 0
    assert "graph_sigma2" not in rec.rounds[-1]  # the walk's sigma2 is no gossip's


def test_l2c_scores_each_clients_mix_of_the_latest_models(data_root: Path) -> None:
    engine = build_engine(validate_config(_l2c(data_root, prune_after=100)))
    engine.run()
    alg = engine.algorithm
    cid = 0
    state = engine.client_states[cid]
    order = [cid, *alg.graph.neighbours[cid]]
    weights = torch.softmax(state["beta"], 0)
    assert not torch.allclose(weights, torch.full_like(weights, 0.25))  # learnt, not uniform
    start = alg.client_start(cid, state)
    for k, v in start.items():
        expected = sum(w * alg.models[j][k] for w, j in zip(weights, order, strict=True))
        torch.testing.assert_close(v, expected)


def test_the_evaluation_adapts_eval_steps_whatever_inner_steps(
    data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import flcore.algorithms.meta.base as meta_base

    seen: list[int] = []

    def spy(*args: object, steps: int, lr: float) -> float:
        seen.append(steps)
        return 0.5

    monkeypatch.setattr(meta_base, "adapted_accuracy", spy)
    raw = _raw(data_root, "lodmeta", rounds=1, eval_every=1)
    raw["algorithm_params"] = {"inner_steps": 1, "inner_lr": 0.1}
    build_engine(validate_config(raw)).run()
    assert set(seen) == {5} and len(seen) == 6 + 2  # every training and unseen client
    seen.clear()
    raw["algorithm_params"] |= {"eval_steps": 3}
    build_engine(validate_config(raw)).run()
    assert set(seen) == {3}


@pytest.mark.parametrize(
    "algorithm, change, key",
    [
        ("l2c", {"algorithm_params": {"first_order": True}}, "first_order"),
        ("fedalt", {"algorithm_params": {"first_order": True}}, "first_order"),
        ("lodmeta", {"graph": {"name": "watts_strogatz", "k": 3, "p": 0.1}}, "graph"),
    ],
)
def test_options_that_would_do_nothing_are_refused(
    data_root: Path,
    algorithm: str,
    change: dict,
    key: str,  # type: ignore[type-arg]
) -> None:
    raw = _raw(data_root, algorithm) | change
    if algorithm == "fedalt":
        raw.pop("graph")
    with pytest.raises(ConfigError, match=key):
        validate_config(raw)
