"""Calibrated leakage on real FMNIST: a guess without the upload gains nothing and is identified
at chance, the true record is identified with a large gain, worst rounds, checkpoints, and the
declared values of an algorithm that uploads nothing. Reconstructions are scored through the
evaluator's own scoring code (``score_reconstructions``); no attack runs here."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from flcore.attacks.baselines import RecordPrior, chance_corrected, chance_tail, identify
from flcore.attacks.evaluation import (
    LEAK_METRICS,
    NOTHING_UPLOADED,
    NOTHING_UPLOADED_LEAKAGE,
    LeakageEvaluator,
)
from flcore.config import validate_config
from flcore.engine import Engine
from flcore.experiment import build_data, build_engine

RECORDS = 30  # the chance test's records (others use fewer: SSIM in float64 is slow)


@pytest.fixture(scope="module")
def raw(data_root: Path) -> dict[str, Any]:
    return {
        "dataset": "fmnist",
        "data_root": str(data_root),
        "num_clients": 4,
        "global_test_per_class": 50,
        "samples_per_client": 300,
        "test_samples_per_client": 20,
        "rounds": 3,
        "local_epochs": 1,
        "batch_size": 50,
        "seed": 2,
        "workers": 1,
        "attack": {"name": "ig", "rounds": [1, 2], "images": RECORDS, "iterations": 1},
    }


@pytest.fixture(scope="module")
def data(raw: dict[str, Any]):  # type: ignore[no-untyped-def]
    return build_data(validate_config(raw))


def _evaluator(raw: dict[str, Any], data, **attack: Any) -> tuple[Engine, LeakageEvaluator]:  # type: ignore[no-untyped-def]
    cfg = validate_config(raw | {"attack": raw["attack"] | attack})
    engine = build_engine(cfg, data=data)
    return engine, engine.probes[0]


def _truth(data, picks: np.ndarray) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return data.client_train(0).images[torch.from_numpy(picks)].float() / 255


def _pool_mean(data) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The dataset's mean training image as a user computes it: over every client's records,
    the attacked ones included."""
    ids = np.unique(np.concatenate([np.asarray(a) for a in data.train.client_indices]))
    return data.splits.train.images[torch.from_numpy(ids)].double().mean(0).float() / 255


PICKS = np.arange(RECORDS)


@pytest.mark.parametrize("labels", ["given", "auto"])
def test_the_mean_image_guess_gains_nothing_and_is_identified_at_chance(
    raw: dict[str, Any], data, labels: str
) -> None:  # type: ignore[no-untyped-def]
    engine, ev = _evaluator(raw, data, labels=labels)
    guess = _pool_mean(data).expand(RECORDS, -1, -1, -1).clone()
    ev.score_reconstructions(engine, 1, 0, PICKS, guess)
    out = ev.summary(engine)
    # it scores ~11 dB raw, which a raw-PSNR front would read as "something recovered"
    assert out["leak_psnr"] > 8
    # its only edge over the leave-one-out baseline is the record's own 1/1200 share of it
    assert 0 <= out["leak_psnr_gain"] < 0.01
    assert 0 <= out["leak_ssim_gain"] < 0.005
    # chance is 1/21: a fixed image picks its own record out of 21 about 1.4 times in 30
    assert out["leak_identified"] < 0.15
    if labels == "given":  # the class mean is a better no-information guess than the mean
        assert out["leak_psnr_baseline"] > out["leak_psnr"] + 1


def test_labels_handed_to_the_attack_let_the_class_mean_into_the_baseline(
    raw: dict[str, Any], data
) -> None:  # type: ignore[no-untyped-def]
    # two records an upload: iDLG cannot read them, so `auto` hands the attack the true labels
    # (label_source "given") and the class mean is a guess without the upload, as under `given`
    baselines = {}
    for labels in ("given", "auto"):
        attack = {"rounds": [1], "images": 2, "batch": 2, "labels": labels}
        cfg = validate_config(raw | {"rounds": 1, "attack": raw["attack"] | attack})
        engine = build_engine(cfg, data=data)
        engine.run()
        ev = engine.probes[0]
        assert ev.label_source == "given"
        baselines[labels] = ev.summary(engine)["leak_psnr_baseline"]
    assert baselines["auto"] == baselines["given"]


def test_the_true_record_is_identified_with_a_large_gain(raw: dict[str, Any], data) -> None:  # type: ignore[no-untyped-def]
    engine, ev = _evaluator(raw, data)
    picks = PICKS[:10]
    truth = _truth(data, picks)
    noisy = (
        truth + 0.02 * torch.randn(truth.shape, generator=torch.Generator().manual_seed(0))
    ).clamp(0, 1)
    ev.score_reconstructions(engine, 1, 0, picks, noisy)
    out = ev.summary(engine)
    assert out["leak_identified"] == 1.0
    # what it corrects: every record identified, where a guess has a chance of 1 in K + 1
    assert out["leak_identified_rate"] == 1.0
    assert out["leak_identified_chance"] == pytest.approx(1 / 21)
    assert out["leak_psnr_gain"] > 15  # ~34 dB against a ~16 dB baseline
    assert out["leak_psnr_gain"] == pytest.approx(out["leak_psnr"] - out["leak_psnr_baseline"])
    _, exact = _evaluator(raw, data)
    exact.score_reconstructions(engine, 1, 0, picks, truth.clone())
    out = exact.summary(engine)
    assert out["leak_identified"] == 1.0 and math.isinf(out["leak_psnr_gain"])


def test_worst_round_is_the_leakiest_rounds_mean_and_rounds_keep_their_own_values(
    raw: dict[str, Any], data
) -> None:  # type: ignore[no-untyped-def]
    engine, ev = _evaluator(raw, data)
    half = np.arange(8)
    truth = _truth(data, half)
    ev.score_reconstructions(engine, 1, 0, half, truth[half] * 0.9)  # round 1 leaks
    r1 = ev.round_metrics(1)
    guess = _pool_mean(data).expand(len(half), -1, -1, -1).clone()
    ev.score_reconstructions(engine, 2, 0, half, guess)  # round 2 does not
    r2 = ev.round_metrics(2)
    assert r1["leak_psnr_gain"] > 5 and r2["leak_psnr_gain"] < 0.01  # per-round history
    assert r2["leak_psnr_gain_worst_round"] == r1["leak_psnr_gain"]  # the worst so far
    assert r2["leak_identified_worst_round"] == r1["leak_identified"] == 1.0
    assert r2["leak_informative"] is None  # no replay here: not decided
    out = ev.summary(engine)
    assert out["leak_psnr_gain"] == pytest.approx((r1["leak_psnr_gain"] + r2["leak_psnr_gain"]) / 2)
    assert out["leak_psnr_gain_worst_round"] == r1["leak_psnr_gain"]
    assert out["leak_identified_worst_round"] == 1.0
    assert out["leak_lpips_worst_round"] is None  # no AlexNet weights in tests
    assert ev.round_metrics(3) == {}  # not attacked


def test_the_calibrated_fields_survive_a_checkpoint(raw: dict[str, Any], data) -> None:  # type: ignore[no-untyped-def]
    engine, ev = _evaluator(raw, data)
    truth = _truth(data, PICKS[:6])
    ev.score_reconstructions(engine, 1, 0, PICKS[:3], truth[:3] * 0.8)
    ev.score_reconstructions(engine, 2, 0, PICKS[3:6], truth[3:6] * 0.5)
    state = ev.state_dict()
    _, restored = _evaluator(raw, data)
    restored.load_state_dict(state)
    assert restored.summary(engine) == ev.summary(engine)
    assert restored.summary(engine)["leak_psnr_gain_worst_round"] is not None
    # a checkpoint written before the calibration: its records load, not measured
    old = {k: v for k, v in state.items()}
    keep = ("round", "client", "psnr", "ssim", "lpips", "label_ok", "embedding_cos")
    old["records"] = [{k: r[k] for k in keep} for r in state["records"]]
    _, legacy = _evaluator(raw, data)
    legacy.load_state_dict(old)
    out = legacy.summary(engine)
    assert out["leak_psnr"] == ev.summary(engine)["leak_psnr"]
    assert out["leak_psnr_gain"] is None and out["leak_identified"] is None


def test_an_algorithm_that_uploads_nothing_declares_zero_calibrated_leakage(
    raw: dict[str, Any], data
) -> None:  # type: ignore[no-untyped-def]
    cfg = validate_config(raw | {"algorithm": "local", "rounds": 1, "attack": {"rounds": [1]}})
    engine = build_engine(cfg, data=data)
    result = next(engine.iter_rounds())
    out = engine.summary()
    for key in ("leak_psnr", "leak_ssim", "leak_psnr_max", "leak_lpips_worst_round"):
        assert out[key] is None and key not in NOTHING_UPLOADED_LEAKAGE
    for key in ("leak_psnr_gain", "leak_identified", "leak_psnr_gain_worst_round"):
        assert out[key] == 0.0 and result.metrics[key] == 0.0  # in the round's report too
    assert out["leak_identified_p"] == 1.0  # no record identified, as chance alone would
    assert out["leak_reason"] == NOTHING_UPLOADED
    assert set(NOTHING_UPLOADED_LEAKAGE) <= set(LEAK_METRICS)


def test_the_prior_leaves_the_record_out_and_never_uses_it_as_a_decoy(data) -> None:  # type: ignore[no-untyped-def]
    train = data.splits.train
    ids = np.array(data.train.client_indices[0][:50])
    prior = RecordPrior.from_pool(train.images, train.labels, ids)
    x, y, rid = train.images[ids[0]], int(train.labels[ids[0]]), int(ids[0])
    others = torch.from_numpy(ids[1:])
    mean_without = train.images[others].double().mean(0) / 255
    assert torch.allclose(
        prior.guesses(x, y, labels_known=False)[0].double(), mean_without, atol=1e-6
    )
    same = others[train.labels[others] == y]
    assert len(prior.guesses(x, y, labels_known=True)) == (2 if len(same) else 1)
    decoys = prior.decoys(x, y, rid, 100, np.random.default_rng(0))
    assert len(decoys) == len(same)  # every other record of the class, never the record
    assert not any(torch.equal(d, x) for d in decoys)


def test_chance_correction() -> None:
    c = [1 / 21] * 21
    assert chance_corrected([1.0] + [0.0] * 20, c) == pytest.approx(0.0)  # a = c
    assert chance_corrected([0.0] * 21, c) == 0.0  # below chance: clamped
    assert chance_corrected([1.0] * 21, c) == 1.0
    assert chance_corrected([1.0, 0.0], [0.5, 0.5]) == 0.0
    assert chance_corrected([], []) is None


def test_chance_tail_is_the_binomial_upper_tail() -> None:
    n, c = 10, 1 / 21
    for k in range(n + 1):
        tail = sum(math.comb(n, j) * c**j * (1 - c) ** (n - j) for j in range(k, n + 1))
        assert chance_tail([1.0] * k + [0.0] * (n - k), [c] * n) == pytest.approx(tail, rel=1e-9)
    assert chance_tail([0.0] * n, [c] * n) == 1.0  # nothing identified: chance does as well
    # records with their own chances (fewer decoys): exact Poisson-binomial
    assert chance_tail([1.0, 1.0], [0.5, 0.25]) == pytest.approx(0.125)
    assert chance_tail([1.0, 0.0], [0.5, 0.25]) == pytest.approx(1 - 0.5 * 0.75)
    assert chance_tail([], []) is None


def test_the_identified_p_value_tells_chance_from_leakage(raw: dict[str, Any], data) -> None:  # type: ignore[no-untyped-def]
    """A reconstruction that says nothing of its record gets a large p; the records
    themselves, identified every one, a vanishing one."""
    engine, ev = _evaluator(raw, data)
    picks = PICKS[:10]
    guess = _pool_mean(data).expand(len(picks), -1, -1, -1).clone()
    ev.score_reconstructions(engine, 1, 0, picks, guess)
    assert ev.summary(engine)["leak_identified_p"] > 0.05
    _, exact = _evaluator(raw, data)
    exact.score_reconstructions(engine, 1, 0, picks, _truth(data, picks).clone())
    assert exact.summary(engine)["leak_identified_p"] == pytest.approx((1 / 21) ** 10)


class _FlatLPIPS:
    """A stand-in LPIPS that is 'available' and finds every pair equally far apart."""

    available = True

    def __call__(self, recon: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
        return torch.ones(len(recon))


def test_identification_uses_lpips_where_real_weights_are_present(data) -> None:  # type: ignore[no-untyped-def]
    """An exact copy is identified by SSIM; a perceptual distance that cannot tell the records
    apart (all ties) identifies nothing: the LPIPS verdict is the one used when present."""
    images = data.client_train(0).images[:4].float() / 255
    decoys = [data.client_train(1).images[:5].float() / 255] * 4
    assert [t.identified for t in identify(images, images, decoys)] == [True] * 4  # type: ignore[union-attr]
    flat = identify(images, images, decoys, _FlatLPIPS())  # type: ignore[arg-type]
    assert [t.identified for t in flat] == [False] * 4  # type: ignore[union-attr]
    assert identify(images[:1], images[:1], [images[:0]]) == [None]  # no decoy: not counted
