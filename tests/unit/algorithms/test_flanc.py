"""FLANC: the composition (Pa3dFL Eq. 3), the regulariser (Eq. 33), basis averaging over all
clients and coefficient averaging per width, and learning on real FMNIST."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import flcore.algorithms.widths.flanc  # noqa: F401  (registers)
from flcore.algorithms import ClientData, ClientResult, ClientTask
from flcore.algorithms.base import ModelSpec
from flcore.algorithms.widths.flanc import FlancDecomposition, compose, orthogonality
from flcore.config import validate_config
from flcore.errors import ConfigError
from flcore.executor import client_generator
from flcore.experiment import build_engine

#: Pa3dFL's FMNIST CNN: clients 0 and 3 at width 1, client 1 at 1/2, client 2 at 1/4
WIDTHS = {
    "model": "pa3dfl_cnn_fmnist",
    "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 0.0625, 1.0]},
}


def make_cfg(data_root: Path, algorithm: str, **over: Any):  # type: ignore[no-untyped-def]
    """4 clients x 100 real FMNIST records, each split 60/20/20 into train/val/test."""
    raw = {
        "algorithm": algorithm,
        "dataset": "fmnist",
        "data_root": str(data_root),
        "num_clients": 4,
        "global_test_per_class": 50,
        "samples_per_client": 100,
        "test_samples_per_client": 20,
        "client_split": {"train": 0.6, "val": 0.2, "test": 0.2},
        "rounds": 3,
        "local_epochs": 2,
        "batch_size": 20,
        "lr": 0.05,
        "workers": 1,
        "seed": 11,
    } | over
    return validate_config(raw)


def run_rounds(engine: Any, rounds: int) -> list[dict[str, float]]:
    """Drive ``rounds`` full-participation rounds through the algorithm's hooks (no global
    evaluation) and return each round's mean client metrics."""
    alg, fed = engine.algorithm, engine.data
    ids = list(range(fed.num_clients))
    out = []
    for r in range(1, rounds + 1):
        alg.begin_round(r, ids)
        metrics: dict[str, list[float]] = {}
        for cid in ids:
            task = ClientTask(cid, r, alg.broadcast(r, cid), engine.client_states[cid], True, 11)
            data = ClientData(cid, fed.client_train(cid), fed.client_test(cid), fed.info)
            res = alg.local_update(data, task, client_generator(11, r, cid))
            engine.client_states[cid] = res.state
            alg.accumulate(res)
            for k, v in res.metrics.items():
                metrics.setdefault(k, []).append(v)
        alg.end_round(r)
        out.append({k: sum(v) / len(v) for k, v in metrics.items()})
    return out


def test_compose_is_eq3_reshaped_by_channels() -> None:
    """W[o, g R1 + c, a] = sum_j U[c A + a, j] V[j, o (S / R1) + g], against a loop."""
    torch.manual_seed(0)
    out_ch, in_ch, r1, area, r2 = 3, 4, 2, 5, 3
    basis = torch.randn(area * r1, r2)
    coef = torch.randn(r2, out_ch * in_ch // r1)
    got = compose(basis, coef, out_ch, in_ch, r1).reshape(out_ch, in_ch, area)
    want = torch.zeros(out_ch, in_ch, area)
    for o in range(out_ch):
        for g in range(in_ch // r1):
            for c in range(r1):
                for a in range(area):
                    col = o * (in_ch // r1) + g
                    want[o, g * r1 + c, a] = (basis[c * area + a] * coef[:, col]).sum()
    torch.testing.assert_close(got, want)


def test_orthogonality_is_eq33() -> None:
    """(1/L) sum ||U^T U - I||^2: 0 for orthonormal columns; for U = 2 I_3 and U = 0_{4x2}
    it is (3 * 9 + 2 * 1) / 2."""
    q, _ = torch.linalg.qr(torch.randn(6, 3, dtype=torch.float64))
    assert float(orthogonality([q])) == pytest.approx(0.0, abs=1e-12)
    assert float(orthogonality([2 * torch.eye(3), torch.zeros(4, 2)])) == pytest.approx(14.5)


def test_decomposition_of_the_fmnist_cnn() -> None:
    spec = ModelSpec("pa3dfl_cnn_fmnist", 10, 1)
    d = FlancDecomposition(spec, 1 / 16)
    ranks = {f.layer: (f.r1, f.r2) for f in d.factors}
    assert ranks == {
        "features.0": (1, 25),
        "features.3": (2, 32),
        "features.7": (4, 64),
        "features.9": (32, 32),
    }
    for width in (1.0, 0.25):
        net = d.net(width)
        composed = d.weights(dict(net.named_parameters()), width)
        plain = spec(width=width).state_dict()
        assert {k: v.shape for k, v in composed.items()} == {k: v.shape for k, v in plain.items()}
        assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    # the basis is shared: the same shapes at every width, fewer coefficients at smaller ones
    full, quarter = d.net(1.0), d.net(0.25)
    assert full.layers.features_7.basis.shape == quarter.layers.features_7.basis.shape == (196, 64)
    assert full.layers.features_7.coef.shape == (64, 64 * 512 // 4)
    assert quarter.layers.features_7.coef.shape == (64, 16 * 128 // 4)
    with pytest.raises(ConfigError, match="model"):
        FlancDecomposition(ModelSpec("cnn_fmnist", 10, 1))


def _const(like: dict[str, torch.Tensor], value: float) -> dict[str, torch.Tensor]:
    return {k: torch.full_like(v, value) for k, v in like.items()}


def test_basis_averaged_over_all_coefficients_per_width(data_root: Path) -> None:
    """Clients 0 (width 1, n 10), 1 (width 1/2, n 30), 3 (width 1, n 20) send constants:
    basis 1, 3, 4 -> (10 + 90 + 80) / 60 = 3; width-1 coefficients 1, 7 -> (10 + 140) / 30 = 5;
    width-1/2 ones are client 1's 5; the width-1/4 level (client 2 absent) is unchanged."""
    engine = build_engine(make_cfg(data_root, "flanc", **WIDTHS))
    alg = engine.algorithm
    quarter = {k: v.clone() for k, v in alg.level[0.25].items()}
    alg.begin_round(1, [0, 1, 3])
    for cid, n, basis, rest in [(0, 10, 1.0, 1.0), (1, 30, 3.0, 5.0), (3, 20, 4.0, 7.0)]:
        sent = alg.broadcast(1, cid)
        up = {
            k: torch.full_like(v, basis if k.endswith(".basis") else rest) for k, v in sent.items()
        }
        alg.accumulate(ClientResult(cid, n, up))
    alg.end_round(1)
    for v in alg.basis.values():
        torch.testing.assert_close(v, torch.full_like(v, 3.0))
    for v in alg.level[1.0].values():
        torch.testing.assert_close(v, torch.full_like(v, 5.0))
    for v in alg.level[0.5].values():
        torch.testing.assert_close(v, torch.full_like(v, 5.0))
    for k, v in alg.level[0.25].items():
        assert torch.equal(v, quarter[k])
    # a width-1/2 client receives the shared basis and its own level's coefficients
    sent = alg.broadcast(2, 1)
    assert set(sent) == set(alg.basis) | set(alg.level[0.5])
    assert sent["layers.features_9.coef"].shape == (32, 256 * 64 // 32)


def test_three_rounds_on_fmnist_learn(data_root: Path) -> None:
    engine = build_engine(make_cfg(data_root, "flanc", **WIDTHS))
    alg = engine.algorithm
    # each client trains, and is costed as, its own width's composed network
    assert alg.cost_model(2).width == 0.25 and alg.cost_model(0).width == 1.0
    rounds = run_rounds(engine, 3)
    assert rounds[0]["accuracy_before"] < 0.3
    assert rounds[-1]["accuracy"] > rounds[0]["accuracy_before"] + 0.2
