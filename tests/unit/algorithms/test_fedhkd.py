"""FedHKD on real FMNIST: the knowledge release (threshold, clipping, noise), Eq. 9's
aggregation, the accountant's epsilon_knowledge, training, and bad input."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from flcore.algorithms.base import ModelSpec
from flcore.algorithms.fedhkd import KnowledgeSum, hkd_loss, local_knowledge
from flcore.callbacks import Callback
from flcore.config import validate_config
from flcore.data import normalize
from flcore.errors import ConfigError
from flcore.experiment import build_engine
from flcore.privacy.accounting import RDP_ORDERS
from flcore.privacy.gaussian import GaussianMechanism


@pytest.fixture(scope="module")
def rep_model():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    return ModelSpec("cnn_fmnist", 10, 1)().eval()


def _images(fmnist, labels: list[int], per_class: int):  # type: ignore[no-untyped-def]
    """``per_class`` real training records of each class in ``labels``, normalised."""
    y = fmnist.train.labels
    idx = torch.cat([torch.nonzero(y == c).flatten()[:per_class] for c in labels])
    return normalize(fmnist.train.images[idx], fmnist.info), y[idx]


def test_a_class_at_or_below_nu_is_not_shared(fmnist, rep_model) -> None:  # type: ignore[no-untyped-def]
    # Prepare: 30 records of class 0, 10 of class 1 (a 0.25 share), 0 of the others
    x0, y0 = _images(fmnist, [0], 30)
    x1, y1 = _images(fmnist, [1], 10)
    x, y = torch.cat([x0, x1]), torch.cat([y0, y1])
    # Execute
    k = local_knowledge(
        rep_model,
        x,
        y,
        num_classes=10,
        temperature=0.5,
        nu=0.25,
        mechanism=None,
        generator=torch.Generator().manual_seed(0),
    )
    # Assert: class 0 (share 0.75) is sent, class 1 (exactly 0.25, not above) is not
    assert k["knowledge.mask"].tolist() == [1.0] + [0.0] * 9
    assert k["knowledge.counts"].tolist() == [30.0] + [0.0] * 9
    assert torch.all(k["knowledge.rep"][1:] == 0) and torch.all(k["knowledge.soft"][1:] == 0)
    with torch.no_grad():
        h = rep_model.represent(x0)
        q = torch.softmax(rep_model.head(h) / 0.5, dim=1)
    torch.testing.assert_close(k["knowledge.rep"][0], h.mean(0))
    torch.testing.assert_close(k["knowledge.soft"][0], q.mean(0))
    assert k["knowledge.soft"][0].sum() == pytest.approx(1.0, abs=1e-5)


def test_aggregation_is_the_count_weighted_mean_over_sharing_clients() -> None:
    # Prepare: 3 clients, 2 classes, 2-d representations; client 3 does not share class 0
    def client(rep, soft, counts, mask):  # type: ignore[no-untyped-def]
        m = torch.tensor(mask, dtype=torch.float32)
        return {
            "knowledge.rep": torch.tensor(rep) * m[:, None],
            "knowledge.soft": torch.tensor(soft) * m[:, None],
            "knowledge.mask": m,
            "knowledge.counts": torch.tensor(counts, dtype=torch.float32) * m,
        }

    clients = [
        client([[1.0, 0.0], [0.0, 2.0]], [[0.9, 0.1], [0.2, 0.8]], [10, 30], [1, 1]),
        client([[3.0, 1.0], [4.0, 0.0]], [[0.7, 0.3], [0.4, 0.6]], [30, 10], [1, 1]),
        client([[9.0, 9.0], [2.0, 2.0]], [[0.5, 0.5], [0.0, 1.0]], [5, 20], [0, 1]),
    ]
    agg = KnowledgeSum()
    # Execute
    for c in clients:
        agg.add(c)
    out = agg.result()
    # Assert: class 0 over clients 1-2 (p = 10/40, 30/40), class 1 over all (10, 10, 20)/60..
    # with client 2's class-1 count 10 and client 3's 20: p = 30/60, 10/60, 20/60
    torch.testing.assert_close(out["knowledge.rep"][0], torch.tensor([2.5, 0.75]))
    torch.testing.assert_close(out["knowledge.soft"][0], torch.tensor([0.75, 0.25]))
    rep1 = (30 * torch.tensor([0.0, 2.0]) + 10 * torch.tensor([4.0, 0.0]) + 20 * 2.0) / 60
    torch.testing.assert_close(out["knowledge.rep"][1], rep1)
    assert out["knowledge.mask"].tolist() == [1.0, 1.0]


def test_clipping_bounds_what_one_replaced_record_moves(fmnist, rep_model) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a class of 20 real records; its neighbour replaces one by another record of
    # the same class; representations scaled up so that clipping binds
    x, y = _images(fmnist, [3], 21)
    with torch.no_grad():
        h = 50 * rep_model.represent(x)
    for norm, bound in (("l2", 4.0), ("coordinate", 0.5)):
        mech = GaussianMechanism(0.0, bound, norm)  # type: ignore[arg-type]
        gen = torch.Generator().manual_seed(0)
        a, _ = mech.release(h[:20], y[:20], 10, gen)
        b, _ = mech.release(torch.cat([h[:19], h[20:]]), y[:20], 10, gen)
        moved = a[3] - b[3]
        # Assert: within Lemma 1's 2 zeta / N (L2, or per coordinate), and clipping did bind
        if norm == "l2":
            assert float(moved.norm()) <= 2 * bound / 20 + 1e-6
            assert float(h[0].norm()) > bound
        else:
            assert float(moved.abs().max()) <= 2 * bound / 20 + 1e-6
            assert float(h.abs().max()) > bound


@pytest.mark.parametrize("norm", ["l2", "coordinate"])
def test_the_noise_has_the_stated_std(fmnist, rep_model, norm: str) -> None:  # type: ignore[no-untyped-def]
    x, y = _images(fmnist, [0, 1], 25)
    with torch.no_grad():
        h = rep_model.represent(x)
    mech = GaussianMechanism(7.0, 2.0, norm)  # type: ignore[arg-type]
    clean = GaussianMechanism(0.0, 2.0, norm)  # type: ignore[arg-type]
    gen = torch.Generator().manual_seed(1)
    base, _ = clean.release(h, y, 10, gen)
    draws = torch.stack([mech.release(h, y, 10, gen)[0] - base for _ in range(200)])
    # std sigma x 2 zeta / N_j = 7 x 4 / 25 = 1.12 per coordinate, for both norms
    assert float(draws[:, :2].std()) == pytest.approx(1.12, rel=0.03)
    assert torch.all(draws[:, 2:] == 0)  # absent classes release nothing
    d = h.shape[1]
    want = 7.0 if norm == "l2" else 7.0 / math.sqrt(d)
    assert mech.accounted_multiplier(d) == pytest.approx(want)


def _raw(data_root: Path, algorithm: str = "fedhkd", **extra: object) -> dict:
    return {
        "experiment": "hkd",
        "algorithm": algorithm,
        "dataset": "fmnist",
        "data_root": str(data_root),
        "num_clients": 4,
        "samples_per_client": 200,
        "partition": {"name": "dirichlet", "beta": 0.5},
        "client_split": {"train": 0.75, "test": 0.25},
        "rounds": 3,
        "local_epochs": 1,
        "batch_size": 64,
        "lr": 1e-3,
        "optimizer": {"name": "adam", "weight_decay": 0.0},
        "client_fraction": 1.0,
        "eval_every": 1,
        "seed": 3,
        "workers": 1,
        "global_test_per_class": 30,
    } | extra


class _Rec(Callback):
    def __init__(self) -> None:
        self.rounds: list[dict] = []

    def on_round_end(self, result) -> None:  # type: ignore[no-untyped-def]
        self.rounds.append(result.metrics)


@pytest.mark.parametrize("algorithm", ["fedhkd", "fedhkd_star"])
def test_three_rounds_improve_local_accuracy_and_epsilon_knowledge_is_the_accountants(
    data_root: Path, algorithm: str
) -> None:
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    rec = _Rec()
    engine = build_engine(validate_config(_raw(data_root, algorithm)), callbacks=[rec])
    engine.run()
    acc = [m["accuracy"] for m in rec.rounds]
    assert acc[-1] > acc[0] + 0.03
    assert all(m["epsilon"] == math.inf for m in rec.rounds)  # model unprotected
    assert engine.algorithm.privacy_tags() == {
        "dp_guarantee": "none",
        "dp_relation": "replace-one-same-label",
    }
    for r, m in enumerate(rec.rounds, 1):
        assert 0 <= m["knowledge_classes_shared"] <= 10
        # R Gaussian releases at sigma 7 (l2), composed by dp-accounting's RDP accountant
        most = max(engine.algorithm.releases) if r == len(rec.rounds) else None
        if most is not None:
            lib = rdp_privacy_accountant.RdpAccountant(orders=RDP_ORDERS)
            lib.compose(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(7.0), most))
            assert m["epsilon_knowledge"] == pytest.approx(lib.get_epsilon(1e-5), rel=1e-6)
    eps = [m["epsilon_knowledge"] for m in rec.rounds]
    assert eps == sorted(eps) and eps[-1] > 0


def test_round_one_is_cross_entropy_only(fmnist, rep_model) -> None:  # type: ignore[no-untyped-def]
    x, y = _images(fmnist, [0, 1, 2], 10)
    ce = torch.nn.functional.cross_entropy(rep_model(x), y)
    loss = hkd_loss(rep_model, x, y, None, lam=0.05, gamma=0.05, temperature=0.5)
    torch.testing.assert_close(loss, ce)
    # with knowledge of class 0 only: the terms of Eq. 11 by hand
    with torch.no_grad():
        h = rep_model.represent(x)
    rep = torch.zeros(10, h.shape[1])
    rep[0] = h[:10].mean(0) + 0.5
    soft = torch.zeros(10, 10)
    soft[0, 0] = 1.0
    mask = torch.zeros(10)
    mask[0] = 1
    k = {"knowledge.rep": rep, "knowledge.soft": soft, "knowledge.mask": mask}
    want = (
        ce
        + 0.05 * (torch.softmax(rep_model.head(rep[:1]) / 0.5, 1) - soft[:1]).norm(dim=1).sum() / 10
        + 0.05 * (h[:10] - rep[0]).norm(dim=1).mean()
    )
    got = hkd_loss(rep_model, x, y, k, lam=0.05, gamma=0.05, temperature=0.5)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    ("key", "value"),
    [("nu", 1.0), ("nu", -0.1), ("temperature", 0.0), ("zeta", 0.0), ("sigma", -1.0)],
)
def test_bad_knowledge_settings_are_refused_at_the_edge(
    data_root: Path, key: str, value: float
) -> None:
    with pytest.raises(ConfigError, match=f"algorithm_params.{key}"):
        validate_config(_raw(data_root, algorithm_params={key: value}))


def test_fedhkd_star_refuses_a_representation_term(data_root: Path) -> None:
    with pytest.raises(ConfigError, match="algorithm_params.gamma"):
        validate_config(_raw(data_root, "fedhkd_star", algorithm_params={"gamma": 0.05}))


def test_the_knowledge_inversion_runs_as_an_evaluation_hook(data_root: Path) -> None:
    # Prepare: 2 rounds, client 0's shared classes inverted at round 2 (a few steps)
    raw = _raw(
        data_root,
        rounds=2,
        knowledge_attack={"rounds": [2], "clients": [0], "iterations": 20},
    )
    rec = _Rec()
    # Execute
    engine = build_engine(validate_config(raw), callbacks=[rec])
    engine.run()
    # Assert: round 2 carries the scores, clamped gains are >= 0, the baseline is measured
    m = rec.rounds[-1]
    assert m["knowledge_classes"] >= 1
    assert m["knowledge_psnr_gain"] >= 0 and m["knowledge_ssim_gain"] >= 0
    assert m["knowledge_psnr_baseline"] > 0
    assert "knowledge_psnr" not in rec.rounds[0] or rec.rounds[0]["knowledge_psnr"] is None


def test_knowledge_attack_on_an_algorithm_without_knowledge_is_refused(data_root: Path) -> None:
    raw = _raw(data_root, "fedavg", knowledge_attack={"rounds": [1]})
    with pytest.raises(ConfigError, match="knowledge_attack.name"):
        validate_config(raw)
