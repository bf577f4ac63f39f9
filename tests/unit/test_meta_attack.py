"""LoDMeta's walk family, FedMAML and FedAlt can be attacked: the surface simulates exactly what
a client's step releases (float64, real FMNIST few-shot tasks), for each rule, clipped or not,
first order or second, and its unknowns are the client's private state ((m, v); FedAlt's
head)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from flcore.algorithms.base import ClientTask
from flcore.config import validate_config
from flcore.data import normalize
from flcore.experiment import build_data, build_engine
from tests.unit.test_vectorized import float64  # noqa: F401  (the fixture)


def _setup(data_root: Any, algorithm: str, **extra: Any):  # type: ignore[no-untyped-def]
    raw = {
        "algorithm": algorithm,
        "dataset": "fmnist",
        "data_root": str(data_root),
        "model": "conv4",
        "model_params": {"hidden": 8},
        "fewshot": {"n_way": 5, "k_shot": 1, "query": 3, "test_query": 3, "unseen_clients": 1},
        "algorithm_params": {"inner_steps": 2},
        "num_clients": 4,
        "rounds": 3,
        "eval_every": 100,
        "lr": 0.01,
        "seed": 5,
        "workers": 1,
        "attack": {"name": "ig", "rounds": [3], "clients": [0], "images": 2, "iterations": 1},
        **extra,
    }
    if algorithm not in ("fedmaml", "fedalt"):  # a server's algorithm has no graph
        raw["graph"] = {"name": "regular", "degree": 2}
    cfg = validate_config(raw)
    engine = build_engine(cfg, data=build_data(cfg))
    evaluator = engine.probes[0]
    engine.probes = []
    rounds = engine.iter_rounds()
    for _ in range(2):
        next(rounds)
    rounds.close()
    return engine, evaluator


def _observe(engine, evaluator, state: Any = "engine"):  # type: ignore[no-untyped-def]
    alg = engine.algorithm
    alg.begin_round(3, [0])
    state = engine.client_states.get(0) if state == "engine" else state
    task = ClientTask(0, 3, alg.broadcast(3, 0), state, False, engine.seed)
    obs, records = evaluator.observe(engine, 3, task)
    return task, obs, records


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for k in a:
        scale = float(b[k].abs().max()) + 1e-30
        assert torch.allclose(a[k], b[k], rtol=0, atol=1e-9 * max(1.0, scale)), (
            k,
            float((a[k] - b[k]).abs().max()),
        )


CASES = {
    "lodmeta": {},
    "lodmeta_basic": {},
    "lodmeta_sgd": {},
    "fedmaml": {},
    "fedmaml-first-order": {"algorithm_params": {"inner_steps": 2, "first_order": True}},
    "fedalt": {"algorithm_params": {"local_steps": 2}},
    "lodmeta-first-order": {"algorithm_params": {"inner_steps": 2, "first_order": True}},
    # clipped at a bound the meta-gradient exceeds; noise 0 (the attacker never simulates it)
    "lodmeta_sgd-clipped": {
        "privacy": {"mechanism": "perturbation", "noise_multiplier": 0.0, "clip": 1e-3}
    },
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_surface_simulates_the_released_step(data_root, float64: None, case: str) -> None:  # noqa: F811
    algorithm = case.split("-")[0]
    engine, evaluator = _setup(data_root, algorithm, **CASES[case])
    # the client's first visit: its own (m, v) at their public initial value, 0
    _, obs, records = _observe(engine, evaluator, state=None)
    x = normalize(records[0].images, engine.data.info)
    y = records[0].labels
    assert len(obs) == 2 and obs[0].num_records == 1
    s = obs[0].surface
    simulated = s.gradient(s.unknowns, x[:1], y[:1])
    _close(simulated, obs[0].target())
    if "clipped" in case:
        raw = s.meta_gradient(x[:1], y[:1])
        norm = torch.sqrt(sum(v.pow(2).sum() for v in raw.values()))
        assert norm > 1e-3  # the clip was active
        released = torch.sqrt(sum(v.pow(2).sum() for v in simulated.values()))
        assert float(released) == pytest.approx(1e-3, rel=1e-9)


def test_lodmeta_hides_its_moments_after_the_first_visit(data_root, float64: None) -> None:  # noqa: F811
    """After a visit the client's (m, v) are private: the surface at their public value 0
    no longer matches the step, the surface given the true (m, v) does."""
    engine, evaluator = _setup(data_root, "lodmeta")
    state = {
        "m": {k: torch.full_like(v, 0.01) for k, v in engine.algorithm.w.items()},
        "v": {k: torch.full_like(v, 2e-4) for k, v in engine.algorithm.w.items()},
    }
    _, obs, records = _observe(engine, evaluator, state=state)
    x = normalize(records[0].images, engine.data.info)[:1]
    y = records[0].labels[:1]
    s = obs[0].surface
    target = obs[0].target()
    at_zero = s.gradient(s.unknowns, x, y)
    assert max(float((at_zero[k] - target[k]).abs().max()) for k in target) > 1e-3
    true = {f"m.{k}": v for k, v in state["m"].items()} | {
        f"v.{k}": v for k, v in state["v"].items()
    }
    _close(s.gradient(true, x, y), target)
    # the unknowns start at 0, never at the client's values
    assert all(float(v.abs().max()) == 0 for v in s.unknowns.values())


def test_fedalt_hides_its_head_after_its_first_round(data_root, float64: None) -> None:  # noqa: F811
    """FedAlt's head is the client's own after its first round: the surface at the head's
    public initial value no longer matches the upload, given the true head it does; and the
    simulated update is differentiable in the records through all its steps (central
    differences, at the record plus a little noise: see the test below)."""
    engine, evaluator = _setup(data_root, "fedalt", algorithm_params={"local_steps": 2})
    alg = engine.algorithm
    gen = torch.Generator().manual_seed(1)
    head = {
        k: v + 0.05 * torch.randn(v.shape, generator=gen, dtype=v.dtype)
        for k, v in alg._split()[1].items()
    }
    _, obs, records = _observe(engine, evaluator, state=head)
    x = normalize(records[0].images, engine.data.info)[:1]
    y = records[0].labels[:1]
    s, target = obs[0].surface, obs[0].target()
    at_init = s.gradient(s.unknowns, x, y)
    assert max(float((at_init[k] - target[k]).abs().max()) for k in target) > 1e-4
    _close(s.gradient({f"v.{k}": v for k, v in head.items()}, x, y), target)
    assert all(torch.equal(s.unknowns[f"v.{k}"], v) for k, v in alg._split()[1].items())
    x = x + 0.05 * torch.randn(x.shape, generator=gen)
    probe = {k: torch.randn(v.shape, generator=gen) for k, v in target.items()}
    direction = torch.randn(x.shape, generator=gen)

    def f(images: torch.Tensor) -> torch.Tensor:
        g = s.gradient(s.unknowns, images, y)
        return sum((g[k] * probe[k]).sum() for k in g)

    leaf = x.clone().requires_grad_(True)
    (dx,) = torch.autograd.grad(f(leaf), leaf)
    h = 1e-7
    numeric = float((f(x + h * direction) - f(x - h * direction)) / (2 * h))
    assert float((dx * direction).sum()) == pytest.approx(numeric, rel=1e-6)


def test_basic_and_sgd_release_the_gradient_itself(data_root, float64: None) -> None:  # noqa: F811
    """What each rule gives away, on one record: LoDMeta-SGD's and LoDMeta-basic's releases are
    the meta-gradient, and FedMAML's upload is (to its server); LoDMeta's first visit is an
    elementwise map of it with the same signs."""
    outs = {}
    for algorithm in ("lodmeta", "lodmeta_basic", "lodmeta_sgd", "fedmaml"):
        engine, evaluator = _setup(data_root, algorithm)
        _, obs, records = _observe(engine, evaluator, state=None)
        x = normalize(records[0].images, engine.data.info)[:1]
        outs[algorithm] = (obs[0].target(), obs[0].surface.meta_gradient(x, records[0].labels[:1]))
    for algorithm in ("lodmeta_basic", "lodmeta_sgd"):
        target, g = outs[algorithm]
        _close(target, {f"w.{k}": v for k, v in g.items()})
    target, g = outs["fedmaml"]
    _close(target, {f"g.{k}": v for k, v in g.items()})
    target, g = outs["lodmeta"]
    for k, v in g.items():
        big = v.abs() > 1e-6
        assert torch.equal(torch.sign(target[f"w.{k}"][big]), torch.sign(v[big]))


@pytest.mark.parametrize("first_order", [True, False])
def test_the_release_is_differentiated_in_the_records_through_the_inner_loop(
    data_root,
    float64: None,  # noqa: F811
    first_order: bool,
) -> None:
    """What IG follows: the derivative in the records of what the step releases, checked
    against central differences (float64). First order too, the adapted weights are built from
    the records' support gradients, so the release moves with the records through them (the
    surface once cut that path); second order it is the network's third derivative, which
    ``F.batch_norm`` does not have (the surface once followed a wrong one). The point is the
    record plus a little noise: at the record itself, max pooling over the flat background
    ties, and the release has no derivative there to compare."""
    engine, evaluator = _setup(
        data_root,
        "lodmeta_sgd",
        algorithm_params={"inner_steps": 2, "first_order": first_order},
    )
    _, obs, records = _observe(engine, evaluator, state=None)
    s = obs[0].surface
    gen = torch.Generator().manual_seed(0)
    x = normalize(records[0].images, engine.data.info)[:1]
    x = x + 0.05 * torch.randn(x.shape, generator=gen)
    y = records[0].labels[:1]
    probe = {k: torch.randn(v.shape, generator=gen) for k, v in s.meta_gradient(x, y).items()}
    direction = torch.randn(x.shape, generator=gen)

    def f(images: torch.Tensor) -> torch.Tensor:
        g = s.meta_gradient(images, y)
        return sum((g[k] * probe[k]).sum() for k in g)

    leaf = x.clone().requires_grad_(True)
    (dx,) = torch.autograd.grad(f(leaf), leaf)
    analytic = float((dx * direction).sum())
    h = 1e-7  # a ReLU or pooling kink sits within 1e-5 of this point, second order
    numeric = float((f(x + h * direction) - f(x - h * direction)) / (2 * h))
    assert analytic == pytest.approx(numeric, rel=1e-6)


@pytest.mark.parametrize(
    "algorithm", ["lodmeta", "lodmeta_basic", "lodmeta_sgd", "fedmaml", "fedalt"]
)
def test_an_attacker_who_knows_the_rest_simulates_the_clients_real_step(
    data_root,
    float64: None,  # noqa: F811
    algorithm: str,
) -> None:
    """``attack.known: rest``: the replayed upload is the client's real step on its whole task
    (not the one-record replay), and the surface given the other records simulates it exactly
    at the true record, in the support set's last slot although the record sits elsewhere in
    the client's set; a wrong candidate does not."""
    attack = {"name": "ig", "rounds": [3], "clients": [0], "images": 2, "iterations": 1}
    engine, evaluator = _setup(data_root, algorithm, attack=attack | {"known": "rest"})
    _, obs, records = _observe(engine, evaluator, state=None)
    engine1, evaluator1 = _setup(data_root, algorithm)
    _, alone, _ = _observe(engine1, evaluator1, state=None)
    info = engine.data.info
    support = engine.data.client_train(0)
    assert len(obs) == 2 and obs[0].num_records == 1
    # both uploads are the same real step; the one-record replay is another
    _close(obs[0].target(), obs[1].target())
    assert (
        max(
            float((obs[0].target()[k] - alone[0].target()[k]).abs().max())
            for k in alone[0].target()
        )
        > 1e-6
    )
    for o, r in zip(obs, records, strict=True):
        s = o.surface
        kx, ky = s.known[0]
        assert len(kx) == len(support) - 1
        x, y = normalize(r.images, info), r.labels
        assert not any(torch.equal(x[0], k) for k in kx)  # the attacked record is not known
        _close(s.gradient(s.unknowns, x, y), o.target())
        other = normalize(support.images[:1], info)
        wrong = s.gradient(s.unknowns, other if not torch.equal(other, x) else -x, y)
        assert max(float((wrong[k] - o.target()[k]).abs().max()) for k in wrong) > 1e-6
    flags = evaluator.informative_flags(
        engine, 3, ClientTask(0, 3, engine.algorithm.broadcast(3, 0), None, False, engine.seed)
    )
    assert flags == [True, True]


def test_known_rest_is_refused_where_the_surface_cannot_take_it(data_root) -> None:
    """Only a step that is one full-batch gradient of the client's set can be simulated with
    the other records known: elsewhere ``attack.known: rest`` is a config error."""
    from flcore.config import ConfigError

    raw = {
        "algorithm": "fedavg",
        "dataset": "fmnist",
        "data_root": str(data_root),
        "num_clients": 2,
        "rounds": 1,
        "attack": {"name": "ig", "known": "rest"},
    }
    with pytest.raises(ConfigError, match="attack.known"):
        validate_config(raw)


def test_each_attacked_record_of_a_known_rest_step_is_its_own_problem(data_root) -> None:
    """Two records of one step share its upload and may share a label: their IG problems differ
    only in the records known, which the resume digest must tell apart (else the second would
    resume the first's images); and each is optimised on its own surface."""
    from flcore.attacks.ig import Problem, problem_digest

    attack = {"name": "ig", "rounds": [3], "clients": [0], "images": 2, "iterations": 2}
    engine, evaluator = _setup(data_root, "lodmeta_sgd", attack=attack | {"known": "rest"})
    task, obs, _ = _observe(engine, evaluator, state=None)
    label = torch.zeros(1, 1, dtype=torch.long)
    digests = {
        problem_digest(
            Problem(o.surface, [o.target()], label, o.image_shape, o.info, torch.device("cpu")),
            iterations=2,
        )
        for o in obs
    }
    assert len(digests) == 2
    evaluator._attack_client(engine, 3, task)
    summary = evaluator.summary(engine)
    assert summary["leak_images"] == 2 and summary["leak_informative"] == 2
    assert summary["leak_psnr"] is not None and summary["leak_psnr_gain"] is not None
