"""Capacity heterogeneity: the width rule, capacity configs, client splits, per-width metrics and
per-client costs (Pa3dFL's setting, flcore.capacity)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from flcore.capacity import Capacity, check_model_widths, make_capacity, width_for
from flcore.config import validate_config
from flcore.errors import ConfigError
from flcore.experiment import build_data, build_engine
from flcore.models.cost import training_cost
from flcore.models.scalable import ScalableCNNFashionMNIST, scaled


@pytest.mark.parametrize(
    ("ratio", "width"),
    [(1.0, 1.0), (0.25, 0.5), (0.0625, 0.25), (0.01, 0.0625), (1 / 256, 0.0625), (0.2, 0.4375)],
)
def test_width_is_the_largest_multiple_of_p_min_whose_square_fits(
    ratio: float, width: float
) -> None:
    assert width_for(ratio, 1 / 16) == pytest.approx(width)
    assert width_for(ratio, 1 / 16) ** 2 <= ratio + 1e-12


def test_a_capacity_below_p_min_squared_has_no_width() -> None:
    with pytest.raises(ValueError, match="below p_min"):
        width_for(0.003, 1 / 16)


def test_uniform_capacity_is_seeded_and_in_range() -> None:
    a = make_capacity("uniform", num_clients=100, seed=3, low=0.01, high=1.0)
    b = make_capacity("uniform", num_clients=100, seed=3, low=0.01, high=1.0)
    c = make_capacity("uniform", num_clients=100, seed=4, low=0.01, high=1.0)
    assert a == b and a != c
    assert all(0.01 <= r <= 1.0 for r in a.ratios)
    assert set(a.levels) <= {k / 16 for k in range(1, 17)}
    assert a.min_width == min(a.widths)
    assert sorted(sum((a.clients_of(w) for w in a.levels), [])) == list(range(100))


def test_ideal_and_fixed_capacities() -> None:
    assert make_capacity("ideal", num_clients=3, seed=0).widths == (1.0, 1.0, 1.0)
    fixed = make_capacity("fixed", num_clients=3, seed=0, ratios=[1, 0.25, 0.0625])
    assert fixed.widths == (1.0, 0.5, 0.25) and fixed.min_width == 0.25
    with pytest.raises(ConfigError, match="one ratio per client"):
        make_capacity("fixed", num_clients=4, seed=0, ratios=[1, 0.25])


def test_widths_must_be_whole_channel_counts() -> None:
    check_model_widths(ScalableCNNFashionMNIST.FULL_CHANNELS, 1 / 16)
    with pytest.raises(ConfigError, match="no channels"):
        check_model_widths(ScalableCNNFashionMNIST.FULL_CHANNELS, 1 / 64)
    with pytest.raises(ConfigError, match="whole channel"):
        check_model_widths(ScalableCNNFashionMNIST.FULL_CHANNELS, 1 / 3)
    with pytest.raises(ValueError, match="whole"):
        scaled(32, 1 / 3)


def _raw(data_root: Path, **extra: object) -> dict:
    return {
        "dataset": "fmnist",
        "data_root": str(data_root),
        "model": "pa3dfl_cnn_fmnist",
        "num_clients": 4,
        "global_test_per_class": 50,
        "samples_per_client": 100,
        "partition": {"name": "iid"},
        "rounds": 1,
        "local_epochs": 1,
        "batch_size": 50,
        "workers": 1,
        "seed": 2,
        **extra,
    }


@pytest.mark.parametrize(
    ("capacity", "key", "needle"),
    [
        ({"name": "uniform", "low": 0.001}, "capacity", "below p_min^2"),
        ({"name": "uniform", "low": 0.5, "high": 0.2}, "capacity", "high"),
        ({"name": "fixed", "ratios": [1, 1, 0.002, 1]}, "capacity", "not in [p_min^2, 1]"),
        ({"name": "fixed", "ratios": [1, 1]}, "capacity.ratios", "one ratio per client"),
        ({"name": "ideal", "p_min": 0.015625}, "capacity.p_min", "no channels"),
        ({"name": "ideal", "ratios": [1, 1, 1, 1]}, "capacity", "ratios is for name: fixed"),
    ],
)
def test_bad_capacity_is_refused_naming_its_key(
    data_root: Path, capacity: dict, key: str, needle: str
) -> None:
    with pytest.raises(ConfigError) as err:
        validate_config(_raw(data_root, capacity=capacity))
    assert err.value.key == key and needle in str(err.value)


def test_capacity_needs_a_width_scalable_model(data_root: Path) -> None:
    with pytest.raises(ConfigError, match="width-scalable") as err:
        validate_config(_raw(data_root, model="cnn_fmnist", capacity={"name": "ideal"}))
    assert err.value.key == "model"


def test_client_split_cuts_each_clients_own_records(data_root: Path) -> None:
    cfg = validate_config(_raw(data_root, client_split={"train": 0.8, "val": 0.1, "test": 0.1}))
    data = build_data(cfg)
    for i in range(cfg.num_clients):
        tr, va, te = (
            data.train.client_indices[i],
            data.val.client_indices[i],  # type: ignore[union-attr]
            data.test.client_indices[i],
        )
        assert (tr.size, va.size, te.size) == (80, 10, 10)
        assert not (set(tr) & set(va) or set(tr) & set(te) or set(va) & set(te))
    # the held-out records are the client's own, from the train split
    records = data.client_test(0)
    idx = data.test.client_indices[0]
    assert torch.equal(records.labels, data.splits.train.labels[torch.tensor(idx)])
    assert data.client_val(0) is not None and len(data.client_val(0).labels) == 10  # type: ignore[union-attr]
    plain = build_data(validate_config(_raw(data_root)))
    assert plain.client_val(0) is None and plain.test_source == "test"
    with pytest.raises(ConfigError, match="sum|must be 1"):
        validate_config(_raw(data_root, client_split={"train": 0.8, "val": 0.1, "test": 0.2}))


def test_capacity_unaware_algorithms_train_the_narrowest_width_and_report_per_width(
    data_root: Path,
) -> None:
    cfg = validate_config(
        _raw(
            data_root,
            algorithm="fedavg",
            capacity={"name": "fixed", "ratios": [1.0, 0.25, 0.25, 0.0625]},
            client_split={"train": 0.8, "val": 0.1, "test": 0.1},
        )
    )
    engine = build_engine(cfg)
    result = next(engine.iter_rounds())
    m = result.metrics
    narrow = ScalableCNNFashionMNIST(width=0.25)
    size = 4 * sum(p.numel() for p in narrow.parameters())
    for w in ("1", "0.5", "0.25"):
        assert m[f"bytes_down_width_{w}"] == size  # every client gets the narrowest model
        assert f"accuracy_width_{w}" in m and f"accuracy_before_width_{w}" in m
    assert m["accuracy_worst_width"] == min(m[f"accuracy_width_{w}"] for w in ("1", "0.5", "0.25"))
    # the width-0.5 cluster is clients 1 and 2
    assert m["round_bytes_down"] == 4 * size
    assert "val_accuracy" in m and "val_accuracy_before" in m
    costs = engine.client_costs()
    assert [c["capacity_width"] for c in costs.values()] == [1.0, 0.5, 0.5, 0.25]
    assert {c["trained_width"] for c in costs.values()} == {0.25}
    assert costs[0]["params"] == sum(p.numel() for p in narrow.parameters())
    assert engine.cost_metrics()["params_width_1"] == costs[0]["params"]


def test_training_flops_match_the_hand_count(fmnist) -> None:  # type: ignore[no-untyped-def]
    from flcore.data import normalize

    x = normalize(fmnist.train.images[:50], fmnist.info)
    y = fmnist.train.labels[:50]
    cost = training_cost(ScalableCNNFashionMNIST(), x, y)
    # forward FLOPs per record (2 x multiply-adds): conv1, conv2, fc1, fc2, head
    fwd = 2 * (25 * 1 * 32 * 28 * 28 + 25 * 32 * 64 * 14 * 14 + 3136 * 512 + 512 * 128 + 128 * 10)
    conv1 = 2 * 25 * 1 * 32 * 28 * 28
    # backward: weight gradients of every layer, input gradients of all but the first
    assert cost["flops"] == 50 * (fwd + 2 * fwd - conv1)
    assert cost["params"] == 1_725_194
    small = training_cost(ScalableCNNFashionMNIST(width=1 / 16), x, y)
    assert 0 < small["peak_memory_bytes"] < cost["peak_memory_bytes"]
    assert cost["memory_source"] == "cpu_profiler"
    assert np.isclose(
        small["params"], sum(p.numel() for p in ScalableCNNFashionMNIST(width=1 / 16).parameters())
    )


def test_measuring_memory_on_the_cpu_prints_nothing(
    fmnist, capfd: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    """torch's profiler writes Kineto's lines to file descriptor 2 at every start on a
    machine without a GPU; a run's output does not carry them, and stderr works after."""
    import sys

    from flcore.data import normalize

    x = normalize(fmnist.train.images[:8], fmnist.info)
    cost = training_cost(ScalableCNNFashionMNIST(width=1 / 16), x, fmnist.train.labels[:8])
    assert cost["peak_memory_bytes"] > 0
    print("after", file=sys.stderr)
    assert capfd.readouterr().err == "after\n"


def test_lr_decays_per_round() -> None:
    from flcore.algorithms.base import LocalTraining

    t = LocalTraining(epochs=1, batch_size=50, lr=0.1, lr_decay=0.998)
    assert t.lr_at(1) == 0.1 and t.lr_at(None) == 0.1
    assert t.lr_at(11) == pytest.approx(0.1 * 0.998**10)
    # FedHKD's step schedule: halved every 10 rounds (rounds 1-10 at lr, 11-20 at lr / 2, ...)
    h = LocalTraining(epochs=1, batch_size=64, lr=1e-3, lr_decay=0.5, lr_decay_every=10)
    assert [h.lr_at(r) for r in (1, 10, 11, 20, 21, 50)] == pytest.approx(
        [1e-3, 1e-3, 5e-4, 5e-4, 2.5e-4, 6.25e-5]
    )


def test_capacity_dataclass_widths() -> None:
    c = Capacity((1.0, 0.3), 1 / 8)
    assert c.widths == (1.0, 0.5) and c.width(1) == 0.5


def test_each_clients_bytes_over_the_run_follow_its_width_and_survive_a_checkpoint(
    data_root: Path, tmp_path: Path
) -> None:
    """Issue 24: bytes up and down per client, which differ by width. HeteroFL sends each client
    its width-p submodel and gets it back: over two full rounds a client's bytes are twice its
    submodel's; they come back with a checkpoint, and a checkpoint that never counted them
    (older code) leaves them out rather than count from the resume."""
    import flcore.algorithms.widths.heterofl  # noqa: F401  (registers)

    cfg = validate_config(
        _raw(
            data_root,
            algorithm="heterofl",
            rounds=2,
            capacity={"name": "fixed", "ratios": [1.0, 0.25, 0.25, 0.0625]},
        )
    )
    engine = build_engine(cfg)
    engine.run()
    costs = engine.client_costs()
    for cid, width in enumerate((1.0, 0.5, 0.5, 0.25)):
        size = 4 * sum(p.numel() for p in ScalableCNNFashionMNIST(width=width).parameters())
        assert costs[cid]["bytes_down"] == costs[cid]["bytes_up"] == 2 * size, cid
    assert costs[0]["bytes_down"] > costs[1]["bytes_down"] > costs[3]["bytes_down"]
    assert sum(c["bytes_down"] for c in costs.values()) == engine.totals["bytes_down"]
    path = engine.save_checkpoint(tmp_path / "c.pt")
    resumed = build_engine(cfg)
    resumed.load_checkpoint(path)
    again = resumed.client_costs()  # (its peak memory measured anew)
    for cid, cost in costs.items():
        assert (again[cid]["bytes_up"], again[cid]["bytes_down"]) == (
            cost["bytes_up"],
            cost["bytes_down"],
        )
    state = torch.load(path, weights_only=False)
    del state["client_bytes"]
    torch.save(state, path)
    older = build_engine(cfg)
    older.load_checkpoint(path)
    assert older.client_bytes is None
    assert all("bytes_down" not in c for c in older.client_costs().values())
