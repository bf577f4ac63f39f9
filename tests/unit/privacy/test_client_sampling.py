"""Client-level DP: the sampling scheme, the estimator and the accounting agree (issue 23 §1.1).

Poisson client sampling divides by qN and is accounted add/remove; fixed-size sampling divides
by m and is accounted replace-one. Epsilons are checked against dp-accounting fed the events
directly, and the fixed-size accounting against a closed form that the factor 2 of the
replace-one sensitivity decides."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from flcore.config import validate_config
from flcore.errors import ConfigError
from flcore.experiment import build_data, build_engine, resolve_privacy
from flcore.privacy.accounting import RDP_ORDERS, Accountant, compute_epsilon
from flcore.privacy.client_level import ClientLevelDP
from flcore.privacy.settings import PrivacySettings
from flcore.testing import algorithm_contract as contract

DELTA = 1e-5


def _cfg(data_root: Path, sampling: str, **over):  # type: ignore[no-untyped-def]
    # noise std sigma S / (qN) = 0.02 per weight: the model still trains (no NaN losses)
    privacy = {"mechanism": "client", "noise_multiplier": 0.8, "clip": 0.05}
    raw = {
        "algorithm": "dp_fedavg_client",
        "data_root": str(data_root),
        "num_clients": 4,
        "global_test_per_class": 50,
        "samples_per_client": 100,
        "test_samples_per_client": 50,
        "rounds": 3,
        "local_epochs": 1,
        "batch_size": 25,
        "lr": 0.05,
        "workers": 1,
        "seed": 1,
        "client_fraction": 0.5,
        "privacy": privacy | {"client_sampling": sampling} | over.pop("privacy", {}),
    } | over
    return validate_config(raw)


def _library_rdp(events: list[tuple[object, int]], relation: NeighboringRelation) -> float:
    acc = rdp_privacy_accountant.RdpAccountant(orders=RDP_ORDERS, neighboring_relation=relation)
    for event, count in events:
        acc.compose(event, count)
    return float(acc.get_epsilon(DELTA))


# ------------------------------------------------------------------ (a) the library's value
def test_poisson_run_epsilon_is_the_poisson_event_under_add_remove(data_root: Path) -> None:
    summary = build_engine(_cfg(data_root, "poisson", client_fraction=0.6)).run()
    # rounds 1-2 at q = client_fraction = 0.6 (not int(0.6 x 4) / 4 = 0.5, the fixed-size
    # rate), the forced full last round at q = 1
    events = [
        (dp_event.PoissonSampledDpEvent(0.6, dp_event.GaussianDpEvent(0.8)), 2),
        (dp_event.GaussianDpEvent(0.8), 1),
    ]
    expected = _library_rdp(events, NeighboringRelation.ADD_OR_REMOVE_ONE)
    # our rdp path is Opacus's RDP accountant: the same event, to the libraries' agreement
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-6)


def test_poisson_pld_epsilon_is_the_library_pld_of_the_event() -> None:
    history = [(0.9, 0.3, 20), (0.9, 1.0, 1)]
    pld = pld_privacy_accountant.PLDAccountant()
    pld.compose(dp_event.PoissonSampledDpEvent(0.3, dp_event.GaussianDpEvent(0.9)), 20)
    pld.compose(dp_event.GaussianDpEvent(0.9), 1)
    assert compute_epsilon(history, DELTA, "pld") == pytest.approx(pld.get_epsilon(DELTA))


def test_fixed_run_epsilon_is_sampling_without_replacement_under_replace_one(
    data_root: Path,
) -> None:
    summary = build_engine(_cfg(data_root, "fixed")).run()
    # 2 of 4 clients in rounds 1-2, all 4 in the forced full last round; sigma read by the
    # library relative to the replace-one sensitivity 2S
    events = [
        (
            dp_event.SampledWithoutReplacementDpEvent(4, 2, dp_event.GaussianDpEvent(0.4)),
            2,
        ),
        (dp_event.GaussianDpEvent(0.4), 1),
    ]
    assert summary["epsilon"] == _library_rdp(events, NeighboringRelation.REPLACE_ONE)
    # the old accounting (Poisson at q = m/N, add/remove) under-reports this mechanism
    assert summary["epsilon"] > compute_epsilon([(0.8, 0.5, 2), (0.8, 1.0, 1)], DELTA)


# ------------------------------------------------------------------ (b) the closed form
@pytest.mark.parametrize("sigma", [0.7, 2.0, 5.0])
def test_fixed_size_at_q1_is_the_add_remove_gaussian_at_half_sigma(sigma: float) -> None:
    """m = N removes the sampling: replace-one sensitivity 2S with noise sigma S is the
    add/remove Gaussian with noise multiplier sigma / 2, whose RDP is alpha / (2 z^2), z = sigma
    / 2. Dropping the factor 2 would give the Gaussian at sigma, a quarter of the RDP."""
    steps, n = 7, 10
    ours = compute_epsilon([(sigma, 1.0, steps)], DELTA, sampling="fixed", population=n)
    acc = Accountant("rdp", sampling="fixed", population=n)
    acc.step(sigma, 1.0, steps)
    assert acc.epsilon(DELTA) == ours
    z = sigma / 2
    orders = np.array(RDP_ORDERS, dtype=float)
    closed_form = rdp_privacy_accountant.compute_epsilon(
        orders, steps * orders / (2 * z**2), DELTA
    )[0]
    assert ours == pytest.approx(closed_form, rel=1e-9)
    library = _library_rdp(
        [(dp_event.GaussianDpEvent(z), steps)], NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    assert ours == pytest.approx(library, rel=1e-9)
    without_factor_2 = compute_epsilon([(sigma, 1.0, steps)], DELTA)  # add/remove at sigma
    assert ours > 1.5 * without_factor_2


# ------------------------------------------------------------------ (c) Poisson mechanism
def _mechanism(sampling: str, n: int, sigma: float, clip: float) -> ClientLevelDP:
    settings = PrivacySettings("client", sigma, clip, DELTA, client_sampling=sampling)
    return ClientLevelDP(settings, n)


def test_poisson_divides_the_clipped_sum_by_qn_not_by_the_count() -> None:
    dp = _mechanism("poisson", 10, 0.0, 100.0)
    rng = np.random.default_rng(0)
    ids = dp.sample_clients(rng, 0.5, force_all=False)
    base = {"w": torch.zeros(3)}
    dp.begin(base)
    dp.add({"w": torch.tensor([1.0, 2.0, 3.0])})
    dp.add({"w": torch.tensor([3.0, 2.0, 1.0])})
    out = dp.result(torch.Generator().manual_seed(0))
    torch.testing.assert_close(out["w"], torch.tensor([4.0, 4.0, 4.0]) / 5.0)  # qN = 5
    assert len(ids) <= 10
    assert dp.accountant.history == [(0.0, 0.5, 1)]


def test_fixed_divides_by_m_and_samples_exactly_m() -> None:
    dp = _mechanism("fixed", 10, 0.0, 100.0)
    ids = dp.sample_clients(np.random.default_rng(0), 0.35, force_all=False)
    assert len(ids) == 3 == len(set(ids))
    dp.begin({"w": torch.zeros(2)})
    for _ in ids:
        dp.add({"w": torch.tensor([3.0, 6.0])})
    out = dp.result(torch.Generator().manual_seed(0))
    torch.testing.assert_close(out["w"], torch.tensor([3.0, 6.0]))
    assert dp.accountant.history == [(0.0, 0.3, 1)]


def test_an_empty_poisson_round_still_releases_noise_and_counts() -> None:
    n, q, sigma, clip = 8, 0.25, 1.5, 2.0
    dp = _mechanism("poisson", n, sigma, clip)
    seed = next(s for s in range(100) if not (np.random.default_rng(s).random(n) < q).any())
    assert dp.sample_clients(np.random.default_rng(seed), q, force_all=False) == []
    base = {"w": torch.zeros(200_000)}
    dp.begin(base)
    out = dp.result(torch.Generator().manual_seed(3))  # no client was added
    std = float(out["w"].std())
    assert std == pytest.approx(sigma * clip / (q * n), rel=0.02)  # noise / qN
    assert dp.accountant.history == [(sigma, q, 1)]
    one = compute_epsilon([(sigma, q, 1)], DELTA)
    assert dp.metrics()["epsilon"] == pytest.approx(one) and one > 0


def test_engine_runs_an_empty_poisson_round(data_root: Path) -> None:
    """A round that samples nobody trains nobody, but the model still moves by the noise and
    the round counts in the accountant."""
    q = 0.05  # with 4 clients a round is empty with probability 0.95^4 = 0.81
    cfg = _cfg(data_root, "poisson", client_fraction=q, full_last_round=False, rounds=2)
    engine = build_engine(cfg)
    rounds = engine.iter_rounds()
    for _ in range(cfg.rounds):
        before = {k: v.clone() for k, v in engine.algorithm.model.state_dict().items()}
        result = next(rounds)
        if not result.client_ids:
            break
    else:
        pytest.fail("no round sampled zero clients: choose another seed")
    rounds.close()
    m = result.metrics
    assert m["clients"] == 0.0 and m["round_bytes_up"] == 0 and m["accuracy"] is None
    after = engine.algorithm.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert m["epsilon"] == pytest.approx(compute_epsilon([(0.8, q, result.round)], DELTA))
    assert m["global_accuracy"] is not None


# ------------------------------------------------------------------ (d) refused accountants
@pytest.mark.parametrize("accountant", ["pld", "prv"])
def test_fixed_size_sampling_refuses_pld_and_prv(data_root: Path, accountant: str) -> None:
    with pytest.raises(ConfigError) as info:
        _cfg(data_root, "fixed", privacy={"accountant": accountant})
    assert info.value.key == "privacy.accountant"
    _cfg(data_root, "poisson", privacy={"accountant": accountant})  # Poisson: any accountant
    with pytest.raises(ConfigError) as info:
        compute_epsilon([(1.0, 0.5, 3)], DELTA, accountant, sampling="fixed", population=4)
    assert info.value.key == "accountant"


def test_fixed_size_sample_rates_must_be_whole_counts() -> None:
    with pytest.raises(ConfigError) as info:
        compute_epsilon([(1.0, 0.33, 3)], DELTA, sampling="fixed", population=10)
    assert info.value.key == "sample_rate"


# ------------------------------------------------------------------ calibration, checkpoints
@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_target_epsilon_is_calibrated_with_the_scheme_events(
    data_root: Path, sampling: str
) -> None:
    cfg = _cfg(
        data_root,
        sampling,
        num_clients=10,
        client_fraction=0.3,
        rounds=5,
        privacy={"noise_multiplier": None, "target_epsilon": 8.0},
    )
    sigma = resolve_privacy(cfg, build_data(cfg)).noise_multiplier  # type: ignore[union-attr]
    schedule = [(0.3, 4), (1.0, 1)]
    kw = {"sampling": sampling, "population": 10 if sampling == "fixed" else None}

    def eps(s: float) -> float:
        return compute_epsilon([(s, q, t) for q, t in schedule], DELTA, **kw)  # type: ignore[arg-type]

    assert eps(sigma) <= 8.0 < eps(0.95 * sigma)


@pytest.mark.parametrize(
    # the same checkpoint path for both schemes; Poisson's (~8 s) runs with make slow
    "sampling",
    [pytest.param("poisson", marks=pytest.mark.slow), "fixed"],
)
def test_the_accountant_survives_a_checkpoint(
    data_root: Path, sampling: str, tmp_path: Path
) -> None:
    cfg = _cfg(data_root, sampling, rounds=2)
    contract.check_checkpoint_round_trip(cfg, build_data(cfg), tmp_path / "c.pt")


def test_a_checkpoint_from_before_client_sampling_resumes_only_as_fixed() -> None:
    old = {"kind": "rdp", "history": [(0.8, 0.5, 3)]}  # m = 2 of 4, fixed-size draws
    fixed = _mechanism("fixed", 4, 0.8, 1.0)
    fixed.load_state_dict(old)
    assert fixed.accountant.history == [(0.8, 0.5, 3)]
    assert fixed.metrics()["epsilon"] == compute_epsilon(
        [(0.8, 0.5, 3)], DELTA, sampling="fixed", population=4
    )
    with pytest.raises(ConfigError) as info:
        _mechanism("poisson", 4, 0.8, 1.0).load_state_dict(old)
    assert info.value.key == "privacy.client_sampling"
    with pytest.raises(ConfigError):
        _mechanism("poisson", 4, 0.8, 1.0).load_state_dict(fixed.state_dict())
    assert math.isfinite(fixed.metrics()["epsilon"])


def test_summary_takes_client_accuracies_from_the_last_round_with_clients(
    data_root: Path,
) -> None:
    """An empty last round (Poisson, no forced full round) measured no client: the run's
    accuracy is the last one measured, its global accuracy the last round's."""
    from flcore.callbacks import RoundResult

    engine = build_engine(_cfg(data_root, "poisson", full_last_round=False, rounds=2))
    engine.history = [
        RoundResult(1, (0, 2), {"accuracy": 0.5, "accuracy_before": 0.4}, True),
        RoundResult(
            2, (), {"accuracy": None, "accuracy_before": None, "global_accuracy": 0.3}, True
        ),
    ]
    summary = engine.summary()
    assert (summary["accuracy"], summary["accuracy_before"]) == (0.5, 0.4)
    assert summary["global_accuracy"] == 0.3
