"""Which uploads carry their record: the record-free replay, the float32 rounding floor (a
diagnostic), and the decision made on the noise-free replay of a DP upload (real FMNIST, real
DP-SGD replays)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from flcore.algorithms.base import ClientTask, LocalTraining
from flcore.attacks import ModelSurface
from flcore.attacks.signal import (
    carries_record,
    implied_gradient_norm,
    record_free,
    rounding_floor,
)
from flcore.config import validate_config
from flcore.experiment import build_data, build_engine

LR = 0.05
WD = 5e-4
TRAINING = LocalTraining(epochs=1, batch_size=1, lr=LR, momentum=0.0, weight_decay=WD)


def _surface() -> tuple[ModelSurface, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    return ModelSurface(model, start), start


def _step(start: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A float32 upload ``w - lr (g + wd w)`` for a random gradient ``g`` of norm ``scale``,
    rounded once (weight decay moves every weight, as in the clients' SGD)."""
    gen = torch.Generator().manual_seed(1)
    g = {k: torch.randn(v.shape, generator=gen, dtype=torch.float64) for k, v in start.items()}
    norm = sum(float(t.pow(2).sum()) for t in g.values()) ** 0.5
    return {
        k: (w.double() - LR * (scale / norm * g[k] + WD * w.double())).float()
        for k, w in start.items()
    }


def test_a_gradientless_upload_reads_as_the_rounding_floor() -> None:
    surface, start = _surface()
    floor = rounding_floor(start, LR)
    # a gradient far below the floor: what the server reads is the rounding, at the floor
    tiny = implied_gradient_norm(surface, _step(start, 1e-3 * floor), TRAINING, 1)
    assert 0.8 < tiny / floor < 1.2
    # a gradient of 10 floors reads as itself
    clear = implied_gradient_norm(surface, _step(start, 10 * floor), TRAINING, 1)
    assert clear / floor == pytest.approx(10, rel=0.05)
    with pytest.raises(ValueError, match="step"):
        rounding_floor(start, 0.0)


def _model(start: dict[str, torch.Tensor]) -> nn.Module:
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))
    model.load_state_dict(start)
    return model


def _sgd(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, scale: float
) -> dict[str, torch.Tensor]:
    """One float32 SGD step with weight decay on ``scale`` x the cross-entropy of ``(x, y)``."""
    model.zero_grad()
    (scale * nn.functional.cross_entropy(model(x), y)).backward()
    with torch.no_grad():
        return {k: v - LR * (v.grad + WD * v) for k, v in model.named_parameters()}


def test_record_free_keeps_values_and_removes_only_the_records_gradient() -> None:
    _, start = _surface()
    model = _model(start)
    x = torch.randn(1, 1, 28, 28, generator=torch.Generator().manual_seed(2))
    with record_free():
        out = model(x)
        loss = nn.functional.cross_entropy(out, torch.tensor([3]))
        prox = sum(p.pow(2).sum() for p in model.parameters())  # not through a forward pass
        (loss + prox).backward()
    assert torch.equal(out, model(x))  # the same values
    for p in model.parameters():  # only the term no record put there is left
        assert torch.equal(p.grad, 2 * p.detach())
    assert model(x).requires_grad  # the hook is gone after the block


def test_an_upload_carries_its_record_exactly_when_it_differs_from_the_record_free_one() -> None:
    surface, start = _surface()
    model = _model(start)
    x = torch.randn(1, 1, 28, 28, generator=torch.Generator().manual_seed(2))
    y = torch.tensor([3])
    with record_free():
        free = _sgd(model, x, y, 1.0)
    floor = rounding_floor(start, LR)
    full = _sgd(model, x, y, 1.0)
    assert carries_record(surface, full, free, TRAINING, 1)
    assert not carries_record(surface, _sgd(model, x, y, 0.0), free, TRAINING, 1)
    # the case the old rule (above 2 floors) missed: a gradient of a third of the floor
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    g = sum(float(p.grad.pow(2).sum()) for p in model.parameters()) ** 0.5
    weak = _sgd(model, x, y, floor / 3 / g)
    assert implied_gradient_norm(surface, weak, TRAINING, 1) < 1.2 * floor
    assert carries_record(surface, weak, free, TRAINING, 1)


@pytest.fixture(scope="module")
def raw(data_root: Path) -> dict[str, Any]:
    return {
        "dataset": "fmnist",
        "data_root": str(data_root),
        "num_clients": 2,
        "global_test_per_class": 50,
        "samples_per_client": 40,
        "test_samples_per_client": 20,
        "rounds": 1,
        "local_epochs": 1,
        "batch_size": 20,
        "lr": LR,
        "seed": 4,
        "workers": 1,
        "attack": {"name": "ig", "rounds": [1], "images": 2, "iterations": 1},
    }


@pytest.fixture(scope="module")
def data(raw: dict[str, Any]):  # type: ignore[no-untyped-def]
    return build_data(validate_config(raw))


def _informative(raw: dict[str, Any], data, **extra: Any) -> tuple[Any, Any]:  # type: ignore[no-untyped-def]
    engine = build_engine(validate_config(raw | extra), data=data)
    result = next(engine.iter_rounds())
    return result.metrics["leak_informative"], engine.summary()["leak_informative"]


@pytest.mark.parametrize(("clip", "expected"), [(1e-30, 0.0), (1e-7, 2.0), (1e-2, 2.0)])
def test_dp_uploads_are_judged_by_their_noise_free_replay(
    raw: dict[str, Any], data, clip: float, expected: float
) -> None:  # type: ignore[no-untyped-def]
    """The noisy uploads at clip 1e-7 and 1e-2 imply gradients far above the floor (noise std
    sigma x clip per weight); only the clean update tells them apart. Clipped to 1e-30 it moves no
    weight by half an ulp: the record-free update to the bit, nothing carried. Clipped to 1e-7
    (below the rounding floor: the rule on the norm alone called it empty) it still moves some
    weights' last bits, the record's direction: carried."""
    privacy = {"mechanism": "dpsgd", "noise_multiplier": 10.0, "clip": clip}
    cfg = raw | {"algorithm": "dp_fedavg", "privacy": privacy}
    engine = build_engine(validate_config(cfg), data=data)
    alg, ev = engine.algorithm, engine.probes[0]
    alg.begin_round(1, [0])
    task = ClientTask(0, 1, alg.broadcast(1, 0), engine.client_states[0], False, 4)
    for obs in ev.observe(engine, 1, task)[0]:  # what the server sees: noise, far above
        floor = rounding_floor(obs.surface.start, LR)
        noisy = implied_gradient_norm(obs.surface, obs.upload, obs.training, 1)
        assert noisy > 20 * floor if clip >= 1e-7 else noisy < 1.2 * floor  # 1e-30: all rounding
    per_round, total = _informative(raw, data, **cfg)
    assert per_round == total == expected


def test_without_dp_the_attacked_upload_decides(raw: dict[str, Any], data) -> None:  # type: ignore[no-untyped-def]
    engine = build_engine(validate_config(raw), data=data)
    assert engine.probes[0].clean_factory is None  # no second replay without noise
    per_round, total = _informative(raw, data)
    assert per_round == total == 2.0  # FedAvg's one-record steps at round 1 carry gradient
