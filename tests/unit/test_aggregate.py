from __future__ import annotations

import pytest
import torch

from flcore.algorithms.aggregate import WeightedMean


def test_weighted_mean_matches_direct_formula() -> None:
    g = torch.Generator().manual_seed(0)
    clients = [
        {"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g)} for _ in range(5)
    ]
    weights = [600.0, 100.0, 250.0, 1.0, 49.0]
    agg = WeightedMean()
    for c, w in zip(clients, weights, strict=True):
        agg.add(c, w)
    out = agg.result()
    total = sum(weights)
    for key in ("w", "b"):
        expected = sum(w * c[key].double() for c, w in zip(clients, weights, strict=True)) / total
        torch.testing.assert_close(out[key], expected.float())
        assert out[key].dtype == torch.float32
    assert agg.count == 5 and agg.total_weight == total


def test_equal_weights_is_plain_mean_and_single_client_is_identity() -> None:
    a, b = {"x": torch.tensor([1.0, 3.0])}, {"x": torch.tensor([3.0, 5.0])}
    agg = WeightedMean()
    agg.add(a, 2)
    agg.add(b, 2)
    assert torch.equal(agg.result()["x"], torch.tensor([2.0, 4.0]))
    one = WeightedMean()
    one.add(a, 7)
    assert torch.equal(one.result()["x"], a["x"])


def test_aggregation_errors() -> None:
    agg = WeightedMean()
    with pytest.raises(ValueError, match="no client"):
        agg.result()
    with pytest.raises(ValueError, match="> 0"):
        agg.add({"x": torch.ones(1)}, 0)
    agg.add({"x": torch.ones(1)}, 1)
    with pytest.raises(ValueError, match="different tensor names"):
        agg.add({"y": torch.ones(1)}, 1)
