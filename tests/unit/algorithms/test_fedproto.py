"""FedProto: prototype aggregation by hand, prototypes are class means of the representations,
the local objective, and three rounds on real FMNIST."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flcore.algorithms.fedproto  # noqa: F401  (registers)
from flcore.algorithms import ClientResult
from flcore.algorithms.aggregate import PrototypeMean
from flcore.algorithms.base import ClientData, ClientTask
from flcore.algorithms.fedproto import prototype_loss
from flcore.data import normalize
from flcore.errors import ConfigError
from flcore.executor import client_generator
from flcore.experiment import build_engine
from flcore.models.base import SplitModel
from tests.unit.algorithms.test_flanc import make_cfg, run_rounds

#: FedHKD's protocol: Adam at 1e-3, Dirichlet label skew
ADAM = {"optimizer": {"name": "adam", "weight_decay": 0.0}, "lr": 1e-3}
SKEW = {"partition": {"name": "dirichlet", "beta": 0.5}}


def _knowledge(counts: list[int], rows: dict[int, float]) -> dict[str, torch.Tensor]:
    """A 10-class, 2-d knowledge upload: class j's row is ``rows[j]`` twice."""
    c = torch.tensor(counts + [0] * (10 - len(counts)), dtype=torch.float32)
    rep = torch.zeros(10, 2)
    for j, v in rows.items():
        rep[j] = v
    return {"knowledge.rep": rep, "knowledge.mask": (c > 0).float(), "knowledge.counts": c}


#: three clients' counts and class rows: A holds 0 and 2, B 0 and 1, C 1 and 2; 3-9 nobody
HAND = [
    ([2, 0, 1], {0: 1.0, 2: 3.0}),
    ([1, 4, 0], {0: 4.0, 1: 2.0}),
    ([0, 1, 3], {1: 5.0, 2: 7.0}),
]


def test_server_aggregates_the_count_weighted_mean_over_holders(data_root: Path) -> None:
    """Class 0: (2x1 + 1x4) / 3 = 2; class 1: (4x2 + 1x5) / 5 = 2.6; class 2: (1x3 + 3x7) / 4
    = 6; classes nobody holds have no prototype (mask 0, zero row). Models average as FedAvg."""
    engine = build_engine(make_cfg(data_root, "fedproto", rounds=2))
    alg = engine.algorithm
    assert "knowledge.rep" not in alg.broadcast(1, 0)  # round 1: no global prototypes
    alg.begin_round(1, [0, 1, 2])
    weights = {k: v for k, v in alg.broadcast(1, 0).items()}
    for cid, (counts, rows) in enumerate(HAND):
        model = {k: torch.full_like(v, float(cid)) for k, v in weights.items()}
        alg.accumulate(ClientResult(cid, 10 * (cid + 1), model | _knowledge(counts, rows)))
    alg.end_round(1)
    sent = alg.broadcast(2, 0)
    want = torch.zeros(10, 2)
    want[0], want[1], want[2] = 2.0, 2.6, 6.0
    torch.testing.assert_close(sent["knowledge.rep"], want)
    assert sent["knowledge.mask"].tolist() == [1.0, 1.0, 1.0] + [0.0] * 7
    # the model is FedAvg's n-weighted mean: (0 x 10 + 1 x 20 + 2 x 30) / 60
    torch.testing.assert_close(sent["head.bias"], torch.full((10,), 80 / 60))


def test_plain_mean_aggregation_by_hand() -> None:
    """``aggregation: mean``: class 0 (1 + 4) / 2 = 2.5, class 1 (2 + 5) / 2, class 2 5."""
    agg = PrototypeMean("mean")
    for counts, rows in HAND:
        k = _knowledge(counts, rows)
        agg.add(k["knowledge.rep"], k["knowledge.mask"], k["knowledge.counts"])
    result = agg.result()
    assert result is not None
    protos, mask = result
    torch.testing.assert_close(protos[:3, 0], torch.tensor([2.5, 3.5, 5.0]))
    assert mask.tolist() == [1.0, 1.0, 1.0] + [0.0] * 7


def _round_one_upload(engine, cid: int):  # type: ignore[no-untyped-def]
    """Client ``cid``'s round-1 upload, its training records, and the representations of
    those records under the uploaded weights (evaluation mode)."""
    alg, fed = engine.algorithm, engine.data
    alg.begin_round(1, [cid])
    task = ClientTask(cid, 1, alg.broadcast(1, cid), None, False, 11)
    train = fed.client_train(cid)
    data = ClientData(cid, train, fed.client_test(cid), fed.info)
    up = alg.local_update(data, task, client_generator(11, 1, cid)).upload
    model = alg.model_spec()
    model.load_state_dict({k: v for k, v in up.items() if not k.startswith("knowledge.")})
    model.eval()
    with torch.no_grad():
        h = model.represent(normalize(train.images, fed.info))
    return up, train, h


def test_upload_holds_the_class_means_of_the_representations(data_root: Path) -> None:
    """The released rows are the per-class means of ``represent`` over the client's training
    records under the uploaded weights; a class the client lacks is not sent (mask 0, zero
    row, count 0)."""
    engine = build_engine(make_cfg(data_root, "fedproto", rounds=1, **SKEW))
    fed = engine.data
    cid = next(c for c in range(4) if len(fed.client_train(c).labels.unique()) < 10)
    up, train, h = _round_one_upload(engine, cid)
    counts = torch.bincount(train.labels, minlength=10)
    assert up["knowledge.counts"].tolist() == counts.float().tolist()
    assert up["knowledge.mask"].tolist() == (counts > 0).float().tolist()
    for j in range(10):
        if counts[j] == 0:
            assert torch.count_nonzero(up["knowledge.rep"][j]) == 0
        else:
            want = h[train.labels == j].mean(0)
            torch.testing.assert_close(up["knowledge.rep"][j], want, rtol=1e-4, atol=1e-5)


def test_local_objective_is_ce_plus_lambda_masked_mse() -> None:
    """lam x mean over [B, d] of (h - C^y)^2, zero for a record whose class has no prototype."""

    class Tiny(SplitModel):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Identity()
            self.head = nn.Linear(2, 3)

    model = Tiny()
    x = torch.tensor([[1.0, 2.0], [0.0, -1.0], [3.0, 1.0]])
    y = torch.tensor([0, 1, 2])
    protos = torch.tensor([[0.0, 0.0], [1.0, 1.0], [9.0, 9.0]])
    mask = torch.tensor([1.0, 1.0, 0.0])  # class 2 has no prototype
    got = prototype_loss(protos, mask, 0.5)(model, x, y)
    # (1 + 4) + (1 + 4) + 0 over 6 elements
    want = F.cross_entropy(model(x), y) + 0.5 * 10.0 / 6.0
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(
        prototype_loss(None, None, 0.5)(model, x, y), F.cross_entropy(model(x), y)
    )


def test_bad_lambda_names_its_key() -> None:
    from flcore.algorithms.fedproto import FedProto

    with pytest.raises(ConfigError, match=r"algorithm_params\.lam"):
        FedProto.validate_params({"lam": -1})
    with pytest.raises(ConfigError, match=r"algorithm_params\.aggregation"):
        FedProto.validate_params({"aggregation": "median"})


def test_three_rounds_on_fmnist_improve_local_accuracy(data_root: Path) -> None:
    engine = build_engine(make_cfg(data_root, "fedproto", **ADAM, **SKEW))
    rounds = run_rounds(engine, 3)
    assert engine.algorithm.prototypes is not None  # rounds 2 and 3 trained with the term
    assert rounds[0]["accuracy_before"] < 0.3
    assert rounds[-1]["accuracy"] > rounds[0]["accuracy_before"] + 0.2


def test_noised_prototypes_are_fedhkds_release_and_their_epsilon_the_accountants(
    data_root: Path,
) -> None:
    """With ``sigma`` > 0 a class row is its clipped mean plus noise of std sigma 2 zeta /
    N_j (FedHKD's mechanism, drawn from the client's generator), and
    ``epsilon_knowledge`` composes the releases with the accountant; at sigma 0 the release
    is the plain mean and its epsilon inf."""
    from flcore.privacy.accounting import compute_epsilon
    from flcore.privacy.gaussian import GaussianMechanism

    params = {"sigma": 7.0, "zeta": 2.0}
    cfg = make_cfg(data_root, "fedproto", rounds=2, algorithm_params=params)
    engine = build_engine(cfg)
    alg = engine.algorithm
    cid = 0
    up, train, h = _round_one_upload(engine, cid)
    h = h.to(torch.float64)
    # the clipped class means (the mechanism at sigma 0)
    clean, counts = GaussianMechanism(0.0, 2.0).release(h, train.labels, 10, torch.Generator())
    assert not torch.allclose(up["knowledge.rep"], clean.float(), atol=1e-3)  # noised
    dev = (up["knowledge.rep"] - clean.float()).to(torch.float64)
    held = counts > 0
    std = (7.0 * 2 * 2.0 / counts[held].double()).unsqueeze(1)
    z = dev[held] / std  # standardised noise: mean ~0, std ~1 over held classes x d
    assert abs(float(z.mean())) < 0.3 and 0.7 < float(z.std()) < 1.3
    alg.accumulate(ClientResult(cid, len(train), up))
    alg.end_round(1)
    eps = alg.privacy_metrics()["epsilon_knowledge"]
    assert eps == pytest.approx(compute_epsilon([(7.0, 1.0, 1)], 1e-5, "rdp"))
    assert alg.privacy_tags()["dp_relation"] == "replace-one-same-label"
    plain = build_engine(make_cfg(data_root, "fedproto", rounds=2)).algorithm
    plain.releases[0] = 3
    assert plain.privacy_metrics()["epsilon_knowledge"] == float("inf")
    assert plain.privacy_tags().get("dp_relation") != "replace-one-same-label"
