"""Ditto's personal objective, LG-FedAvg's nested head aggregation, Local-only's widths, and
three rounds of each on real FMNIST."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flcore.algorithms.ditto  # noqa: F401  (registers)
import flcore.algorithms.lg_fedavg  # noqa: F401  (registers)
from flcore.algorithms import ClientResult
from flcore.algorithms.base import seeded
from flcore.algorithms.cover import CoverMean
from flcore.algorithms.ditto import proximal_loss
from flcore.algorithms.lg_fedavg import leading_index
from flcore.experiment import build_engine
from tests.unit.algorithms.test_flanc import WIDTHS, make_cfg, run_rounds


def test_ditto_personal_gradient_is_ce_plus_lambda_times_distance() -> None:
    """grad h(v) = grad CE(v) + lambda (v - w) on a 2 -> 2 linear model."""
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -2.0], [0.5, 3.0]]))
        model.bias.copy_(torch.tensor([0.25, -1.0]))
    anchor = {"weight": torch.tensor([[0.0, -1.0], [1.5, 3.0]]), "bias": torch.zeros(2)}
    x, y = torch.tensor([[1.0, 2.0], [-1.0, 0.5]]), torch.tensor([0, 1])
    proximal_loss(anchor, 0.7)(model, x, y).backward()
    got = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    for k, p in model.named_parameters():
        want = p.grad + 0.7 * (p.detach() - anchor[k])
        torch.testing.assert_close(got[k], want)
    # the distance term is lambda/2 * ||v - w||^2: (1 + 1 + 1 + 0 + 0.0625 + 1) * 0.35
    extra = proximal_loss(anchor, 0.7)(model, x, y) - F.cross_entropy(model(x), y)
    assert float(extra.detach()) == pytest.approx(4.0625 * 0.35)


def test_ditto_uploads_the_global_model_and_keeps_the_personal_one(data_root: Path) -> None:
    engine = build_engine(make_cfg(data_root, "ditto", rounds=1))
    w0 = seeded((11, 0x1417), engine.algorithm.model_spec).state_dict()
    assert all(torch.equal(engine.client_states[0][k], w0[k]) for k in w0)  # v starts at w^0
    [r] = run_rounds(engine, 1)
    state = engine.client_states[0]
    assert set(state) == set(w0)
    server = engine.algorithm.model.state_dict()
    assert any(not torch.equal(state[k], server[k]) for k in server)  # v is not the average
    assert 0 <= r["accuracy"] <= 1


def test_nested_mean_by_hand() -> None:
    """Full w [2, 4], b [3]; A (n 1) holds all of w and b[:2], = 1; B (n 3) the first 2 columns
    of w and b[:1], = 5: w's columns 0-1 -> (1 + 15) / 4 = 4, columns 2-3 -> A's 1; b -> 4, 1,
    and its last entry, which nobody held, keeps its value."""
    full = {"w": torch.zeros(2, 4), "b": torch.full((3,), 9.0)}
    mean = CoverMean(full)
    for value, n, shapes in [
        (1.0, 1, {"w": (2, 4), "b": (2,)}),
        (5.0, 3, {"w": (2, 2), "b": (1,)}),
    ]:
        upload = {k: torch.full(shape, value) for k, shape in shapes.items()}
        mean.add(upload, {k: leading_index(shape) for k, shape in shapes.items()}, float(n))
    out = mean.result()
    torch.testing.assert_close(out["w"], torch.tensor([[4.0, 4, 1, 1], [4.0, 4, 1, 1]]))
    torch.testing.assert_close(out["b"], torch.tensor([4.0, 1, 9]))


def test_lg_fedavg_head_across_two_widths(data_root: Path) -> None:
    """Clients 0 (width 1, n 1) and 1 (width 1/2, n 3) upload constant heads 1 and 5 (bias 2
    and 6): columns 0-63 of head.weight -> (1 + 15) / 4 = 4, columns 64-127 -> 1, bias -> 5."""
    engine = build_engine(make_cfg(data_root, "lg_fedavg", **WIDTHS))
    alg = engine.algorithm
    assert alg.head["head.weight"].shape == (10, 128)
    sent = alg.broadcast(1, 1)
    assert sent["head.weight"].shape == (10, 64) and sent["head.bias"].shape == (10,)
    assert torch.equal(sent["head.weight"], alg.head["head.weight"][:, :64])
    # the representation stays with the client, at its width
    assert engine.client_states[2]["features.9.weight"].shape == (32, 128)
    alg.begin_round(1, [0, 1])
    for cid, n, value in [(0, 1, 1.0), (1, 3, 5.0)]:
        up = {k: torch.full_like(v, value) for k, v in alg.broadcast(1, cid).items()}
        up["head.bias"] = up["head.bias"] + 1
        alg.accumulate(ClientResult(cid, n, up))
    alg.end_round(1)
    w = alg.head["head.weight"]
    torch.testing.assert_close(w[:, :64], torch.full((10, 64), 4.0))
    torch.testing.assert_close(w[:, 64:], torch.full((10, 64), 1.0))
    torch.testing.assert_close(alg.head["head.bias"], torch.full((10,), 5.0))


def test_local_without_capacity_starts_from_the_fedavg_model(data_root: Path) -> None:
    engine = build_engine(make_cfg(data_root, "local", client_split=None))
    alg = engine.algorithm
    init = seeded((11, 0x1417), alg.model_spec).state_dict()  # FedAvg's server model
    for cid in range(4):
        state = engine.client_states[cid]
        assert set(state) == set(init)
        assert all(torch.equal(state[k], init[k]) for k in init)


def test_local_with_capacity_trains_each_clients_width(data_root: Path) -> None:
    engine = build_engine(make_cfg(data_root, "local", **WIDTHS))
    widths = [1.0, 0.5, 0.25, 1.0]
    for cid, p in enumerate(widths):
        want = seeded((11, 0x1417), lambda p=p: engine.algorithm.model_spec(width=p)).state_dict()
        state = engine.client_states[cid]
        assert state["features.9.weight"].shape == (int(128 * p), int(512 * p))
        assert torch.equal(state["head.weight"], want["head.weight"])
    run_rounds(engine, 1)
    assert engine.client_states[1]["features.0.weight"].shape == (16, 1, 5, 5)


@pytest.mark.parametrize(
    ("algorithm", "extra"), [("ditto", {}), ("lg_fedavg", WIDTHS), ("local", WIDTHS)]
)
def test_three_rounds_on_fmnist_learn(data_root: Path, algorithm: str, extra: dict) -> None:
    rounds = run_rounds(build_engine(make_cfg(data_root, algorithm, **extra)), 3)
    assert rounds[0]["accuracy_before"] < 0.3
    assert rounds[-1]["accuracy"] > rounds[0]["accuracy_before"] + 0.2


def test_ditto_with_dpsgd_is_tagged_and_spends_what_dp_fedavg_spends(data_root: Path) -> None:
    """Ditto's upload is its DP-SGD-trained global model only (the personal model never leaves
    or feeds it), so its record-level epsilon is DP-FedAvg's for the same sampling, and the run
    carries the tags that say so."""
    from flcore.config import validate_config

    spent = {}
    for algorithm in ("dp_fedavg", "ditto"):
        raw = {
            "algorithm": algorithm,
            "data_root": str(data_root),
            "num_clients": 3,
            "global_test_per_class": 50,
            "samples_per_client": 60,
            "rounds": 2,
            "local_epochs": 1,
            "batch_size": 20,
            "workers": 1,
            "seed": 1,
            "privacy": {"mechanism": "dpsgd", "noise_multiplier": 1.0, "clip": 1.0},
        }
        engine = build_engine(validate_config(raw))
        summary = engine.run()
        assert engine.algorithm.privacy_tags() == {
            "dp_guarantee": "isrl",
            "dp_relation": "add-remove",
        }
        spent[algorithm] = summary["epsilon"]
    assert 0 < spent["ditto"] == spent["dp_fedavg"] < float("inf")
