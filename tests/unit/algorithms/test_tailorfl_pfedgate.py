"""TailorFL's filter selection and n_i / p_i aggregation, pFedGate's knapsack and budget, and a
few rounds of each on real FMNIST under capacity heterogeneity."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import flcore.algorithms.widths.pfedgate  # noqa: F401  (registers)
import flcore.algorithms.widths.tailorfl  # noqa: F401  (registers)
from flcore.algorithms import ClientResult
from flcore.algorithms.cover import CoverMean
from flcore.algorithms.widths.pfedgate import GatedModel, block_sizes, knapsack_select
from flcore.algorithms.widths.tailorfl import select_filters
from flcore.config import validate_config
from flcore.data import normalize
from flcore.experiment import build_engine

RATIOS = [1.0, 0.25, 0.0625, 1.0]  # widths 1, 1/2, 1/4, 1


def _cfg(data_root: Path, algorithm: str, **over):  # type: ignore[no-untyped-def]
    raw = {
        "algorithm": algorithm,
        "dataset": "fmnist",
        "data_root": str(data_root),
        "model": "pa3dfl_cnn_fmnist",
        "num_clients": 4,
        "global_test_per_class": 50,
        "samples_per_client": 100,
        "client_split": {"train": 0.6, "val": 0.2, "test": 0.2},
        "capacity": {"name": "fixed", "ratios": RATIOS},
        "rounds": 3,
        "local_epochs": 2,
        "batch_size": 10,
        "lr": 0.1,
        "eval_every": 1,
        "seed": 7,
        "workers": 1,
    } | over
    return validate_config(raw)


# ---------------------------------------------------------------------------- TailorFL
def test_select_filters_keeps_exactly_the_k_highest() -> None:
    scores = torch.tensor([0.3, 0.9, 0.1, 0.9, 0.5, -2.0])
    assert select_filters(scores, 3).tolist() == [1, 3, 4]
    assert select_filters(scores, 1).tolist() == [1]  # a tie goes to the lower index
    assert select_filters(scores, 6).tolist() == list(range(6))
    with pytest.raises(ValueError, match="cannot keep"):
        select_filters(scores, 0)


def test_each_client_keeps_its_p_c_most_important_filters(data_root: Path) -> None:
    engine = build_engine(_cfg(data_root, "tailorfl", algorithm_params={"tune": 0.0}))
    alg = engine.algorithm
    gen = torch.Generator().manual_seed(0)
    for cid in range(4):
        alg.importance[cid] = {
            layer: torch.rand(v.shape, generator=gen) for layer, v in alg.importance[cid].items()
        }
    own = [{k: v.clone() for k, v in c.items()} for c in alg.importance]
    alg._retune()  # tune 0: the selection is each client's own importance alone
    for cid, width in enumerate([1.0, 0.5, 0.25, 1.0]):
        for layer, full in {"conv1": 32, "conv2": 64, "fc1": 512, "fc2": 128}.items():
            k = int(full * width)
            expected = torch.topk(own[cid][layer], k).indices.sort().values
            assert torch.equal(alg.keep[cid][layer], expected), (cid, layer)
            pruned = torch.ones(full, dtype=torch.bool)
            pruned[expected] = False
            assert torch.all(alg.importance[cid][layer][pruned] == 0)  # pruned: scale 0
    # the broadcast is exactly those filters, at the client's width
    payload = alg.broadcast(1, 1)
    keep = alg.keep[1]["conv1"]
    assert torch.equal(payload["features.0.weight"], alg.model.features[0].weight[keep])
    assert payload["features.3.weight"].shape == (32, 16, 5, 5)
    assert payload["features.7.weight"].shape == (256, 32 * 49)
    assert torch.equal(payload["importance.conv1"], alg.importance[1]["conv1"][keep])


def test_similar_clients_pull_a_client_towards_their_filters(data_root: Path) -> None:
    engine = build_engine(_cfg(data_root, "tailorfl", algorithm_params={"tune": 0.5}))
    alg = engine.algorithm
    layers = {"conv1": 32, "conv2": 64, "fc1": 512, "fc2": 128}
    # clients 0 and 3 (full width) agree that filter 31 of conv1 matters most; client 1
    # (width 1/2) holds filters 0..15 with a nearly dead filter 15
    for cid in (0, 3):
        alg.importance[cid] = {k: torch.full((n,), 0.2) for k, n in layers.items()}
        alg.importance[cid]["conv1"][31] = 1.0
    alg.importance[1] = {k: torch.zeros(n) for k, n in layers.items()}
    for k, n in layers.items():
        alg.importance[1][k][: n // 2] = 0.6
    alg.importance[1]["conv1"][15] = 0.01
    alg._retune()
    assert 31 in alg.keep[1]["conv1"].tolist() and 15 not in alg.keep[1]["conv1"].tolist()
    assert len(alg.keep[1]["conv1"]) == 16
    assert float(alg.importance[1]["conv1"][31]) > 0  # enters with its peers' importance


def test_cover_mean_weights_each_holder_by_n_over_p() -> None:
    base = {"w": torch.full((5, 2), 7.0)}
    mean = CoverMean(base)
    # (filters held, value, n_i, p_i)
    for held, value, n, p in [
        ([0, 1], 1.0, 10, 0.5),
        ([1, 3], 3.0, 30, 0.5),
        ([0, 1, 2, 3], 2.0, 10, 1.0),
    ]:
        idx = torch.tensor(held)
        mean.add({"w": torch.full((len(held), 2), value)}, {"w": (idx,)}, n / p)
    out = mean.result()["w"][:, 0]
    expected = [
        (20 * 1 + 10 * 2) / 30,  # filter 0: clients A and C
        (20 * 1 + 60 * 3 + 10 * 2) / 90,  # filter 1: all three
        2.0,  # filter 2: C alone
        (60 * 3 + 10 * 2) / 70,  # filter 3: B and C
        7.0,  # filter 4: nobody held it, it keeps its value
    ]
    assert torch.allclose(out, torch.tensor(expected))


def test_tailorfl_aggregates_with_n_over_p(data_root: Path) -> None:
    engine = build_engine(_cfg(data_root, "tailorfl"))
    alg = engine.algorithm
    alg.begin_round(1, [0, 1, 2, 3])
    values, counts = [1.0, 2.0, 3.0, 4.0], [10, 20, 30, 40]
    for cid in range(4):
        payload = alg.broadcast(1, cid)
        upload = {k: torch.full_like(v, values[cid]) for k, v in payload.items()}
        alg.accumulate(ClientResult(cid, counts[cid], upload))
    alg.end_round(1)
    bias = alg.model.features[0].bias.detach()  # conv1: clients 1, 2 hold filters 0-15, 0-7
    w = [c / p for c, p in zip(counts, [1.0, 0.5, 0.25, 1.0], strict=True)]
    all4 = sum(wi * v for wi, v in zip(w, values, strict=True)) / sum(w)
    three = (w[0] * 1 + w[1] * 2 + w[3] * 4) / (w[0] + w[1] + w[3])
    two = (w[0] * 1 + w[3] * 4) / (w[0] + w[3])
    assert torch.allclose(bias[:8], torch.tensor(all4))
    assert torch.allclose(bias[8:16], torch.tensor(three))
    assert torch.allclose(bias[16:], torch.tensor(two))


# ---------------------------------------------------------------------------- pFedGate
def test_knapsack_picks_the_best_valued_blocks_within_the_budget() -> None:
    values = torch.tensor([0.9, 0.2, 0.8, 0.5])
    sizes = torch.tensor([4.0, 1.0, 3.0, 2.0])
    # by value: block 0 (4), block 2 would overflow (7), block 3 fits (6), block 1 overflows
    assert knapsack_select(values, sizes, 6.0).tolist() == [True, False, False, True]
    # protected blocks are offered first
    assert knapsack_select(values, sizes, 6.0, protected=[1]).tolist() == [
        True,
        True,
        False,
        False,
    ]
    assert not knapsack_select(values, sizes, 0.5).any()
    assert block_sizes(25, 5) == [5] * 5 and block_sizes(27, 5) == [6, 6, 6, 6, 3]
    assert block_sizes(3, 5) == [1, 1, 1]


@pytest.mark.parametrize("ratio", [0.0625, 0.25, 0.5])
def test_gated_model_activates_at_most_its_share(fmnist, ratio: float) -> None:  # type: ignore[no-untyped-def]
    from flcore.models import build_model

    torch.manual_seed(0)
    net = build_model("pa3dfl_cnn_fmnist", num_classes=10, in_channels=1)
    gated = GatedModel(net, ratio, 5, (1, 28, 28))
    x = normalize(fmnist.train.images[:50], fmnist.info)
    gates = gated.gates(x).detach()
    sizes = gated.sizes.float()
    total = float(sizes.sum())
    active = float(sizes[gates > 0].sum())
    assert 0 < active <= ratio * total
    for group in (gated.linear_blocks, ~gated.linear_blocks):  # the budget holds per group
        assert float(sizes[group & (gates > 0)].sum()) <= ratio * float(sizes[group].sum())
    # an active block's gate is its score (clipped below at min(1/B, r)), the rest are 0
    score = torch.sigmoid(gated.gate(x)).mean(0).detach()
    assert torch.allclose(gates[gates > 0], score.clamp_min(gated.min_score)[gates > 0])
    out = gated(x)
    assert out.shape == (50, 10) and torch.isfinite(out).all()


# ---------------------------------------------------------------------------- learning
@pytest.mark.parametrize("algorithm", ["tailorfl", "pfedgate"])
def test_three_rounds_improve_accuracy(data_root: Path, algorithm: str) -> None:
    engine = build_engine(_cfg(data_root, algorithm))
    rounds = list(engine.iter_rounds())
    first, last = rounds[0].metrics, rounds[-1].metrics
    assert last["accuracy"] >= first["accuracy_before"] + 0.2, (first, last)
    assert last["train_loss"] < first["train_loss"] - 0.1
    assert last["global_accuracy"] is None  # personal models only
