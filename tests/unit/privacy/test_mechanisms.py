"""The Gaussian mechanism on class means (FedHKD) and parameter perturbation (LoDMeta), on real
FMNIST statistics, and the mechanism registry."""

from __future__ import annotations

import math

import pytest
import torch

from flcore.data import normalize
from flcore.errors import ConfigError, UnknownNameError
from flcore.privacy import (
    MECHANISMS,
    Accountant,
    GaussianMechanism,
    ParameterPerturbation,
    classic_gaussian_multiplier,
    compute_epsilon,
    network_dp_epsilon,
)
from flcore.privacy.gaussian import class_means, clip_rows


def test_every_mechanism_is_registered_and_unknown_names_list_them() -> None:
    assert MECHANISMS.names() == ["client", "dpsgd", "gaussian", "perturbation"]
    with pytest.raises(UnknownNameError, match="gaussian"):
        MECHANISMS.get("laplace")


def test_classic_multiplier_holds_only_below_epsilon_one() -> None:
    assert classic_gaussian_multiplier(0.5, 1e-5) == pytest.approx(
        math.sqrt(2 * math.log(1.25 / 1e-5)) / 0.5
    )
    for bad in (1.0, 4.0):
        with pytest.raises(ConfigError, match="epsilon < 1"):
            classic_gaussian_multiplier(bad, 1e-5)
    with pytest.raises(ConfigError, match="delta"):
        classic_gaussian_multiplier(0.5, 1.5)
    with pytest.raises(ConfigError, match="epsilon"):
        classic_gaussian_multiplier(0.0, 1e-5)


def _features(fmnist, n: int = 300):  # type: ignore[no-untyped-def]
    x = normalize(fmnist.train.images[:n], fmnist.info).flatten(1)
    return x, fmnist.train.labels[:n]


def test_class_mean_sensitivity_is_two_zeta_over_count(fmnist) -> None:  # type: ignore[no-untyped-def]
    """Replacing one record by another of the same class moves that class's clipped mean by at
    most 2 zeta / N_j, and no other class mean at all (FedHKD's Lemma 1)."""
    x, y = _features(fmnist)
    zeta = 5.0
    assert (x.norm(dim=1) > zeta).all()  # every record is clipped: the bound is tight-ish
    means, counts = class_means(clip_rows(x, zeta), y, 10)
    mech = GaussianMechanism(1.0, zeta)
    sens = mech.sensitivity(counts)
    spare = normalize(fmnist.train.images[1000:1300], fmnist.info).flatten(1)
    spare_y = fmnist.train.labels[1000:1300]
    for j in range(10):
        i = int((y == j).nonzero()[0])  # the first record of class j ...
        k = int((spare_y == j).nonzero()[0])  # ... replaced by another of class j
        x2 = x.clone()
        x2[i] = spare[k]
        means2, counts2 = class_means(clip_rows(x2, zeta), y, 10)
        assert torch.equal(counts, counts2)
        moved = (means2 - means).norm(dim=1)
        assert moved[j] <= sens[j] * (1 + 1e-5)
        assert moved[j] > 0.1 * sens[j]  # not trivially zero
        assert torch.all(moved[torch.arange(10) != j] == 0)
    assert sens[0] == pytest.approx(2 * zeta / int(counts[0]))


def test_class_mean_noise_has_the_calibrated_scale(fmnist) -> None:  # type: ignore[no-untyped-def]
    x, y = _features(fmnist, 200)
    x, y = x[:, 300:364], y.clone()  # 64 pixel values per image: enough to see the scale
    y[y == 9] = 8  # class 9 absent: released as zeros, count 0
    mech = GaussianMechanism(2.0, 3.0)
    g = torch.Generator().manual_seed(0)
    clean, counts = class_means(clip_rows(x, 3.0), y, 10)
    draws = torch.stack([mech.release(x, y, 10, g)[0] for _ in range(300)])
    noise = draws - clean
    assert counts[9] == 0 and torch.all(draws[:, 9] == 0)
    for j in range(9):
        expected = 2.0 * 2 * 3.0 / int(counts[j])
        assert float(noise[:, j].std()) == pytest.approx(expected, rel=0.03)
    # repeated releases compose in the accountant, never by summing per-release epsilons
    acc = Accountant("rdp")
    for _ in range(50):
        acc.step(mech.noise_multiplier, 1.0, 1)
    assert acc.epsilon(1e-5) == pytest.approx(compute_epsilon([(2.0, 1.0, 50)], 1e-5))


def test_perturbation_matches_lodmeta_variance_and_clips_to_m_meta(fmnist) -> None:  # type: ignore[no-untyped-def]
    eps, delta, m = 0.5, 1e-5, 0.2
    mech = ParameterPerturbation.from_epsilon(eps, delta, clip=m)
    assert mech.std**2 == pytest.approx(8 * m**2 * math.log(1.25 / delta) / eps**2)
    x, _ = _features(fmnist, 4)
    update = {"a": x[:2], "b": x[2:, :10]}
    clipped = mech.clip_update(update)
    norm = math.sqrt(sum(float(v.pow(2).sum()) for v in clipped.values()))
    assert norm == pytest.approx(m, rel=1e-5)
    small = {k: v * 1e-6 for k, v in update.items()}
    assert all(
        torch.equal(a, b)
        for a, b in zip(mech.clip_update(small).values(), small.values(), strict=True)
    )
    g = torch.Generator().manual_seed(1)
    noisy = mech.perturb({"w": torch.zeros(20000)}, g)["w"]
    assert float(noisy.std()) == pytest.approx(mech.std, rel=0.03)
    with pytest.raises(ConfigError, match="clip"):
        ParameterPerturbation(1.0, 0.0)
    with pytest.raises(ConfigError, match="noise_multiplier"):
        ParameterPerturbation(-1.0, 1.0)


def test_network_dp_epsilon_is_theorem_4_5() -> None:
    eps, delta, dh, T, n = 0.5, 1e-5, 1e-5, 1000, 20
    n_u = T / n + math.sqrt(3 / n * T * math.log(1 / dh))
    q = max(2 * n_u, 2 * math.log(1 / delta))
    want = math.sqrt(2 * q * math.log(1 / delta)) * eps / math.sqrt(math.log(1.25 / delta))
    got = network_dp_epsilon(eps, delta, steps=T, num_clients=n, delta_hat=dh)
    assert got == pytest.approx(want)
    assert network_dp_epsilon(eps, delta, steps=2 * T, num_clients=n, delta_hat=dh) > got
    with pytest.raises(ConfigError, match="epsilon < 1"):
        network_dp_epsilon(2.0, delta, steps=T, num_clients=n, delta_hat=dh)
    with pytest.raises(ConfigError, match="delta < 1/2"):
        network_dp_epsilon(eps, 0.6, steps=T, num_clients=n, delta_hat=dh)


def test_the_config_offers_exactly_the_registered_mechanisms() -> None:
    from typing import get_args

    from flcore.config import PrivacyConfig

    offered = get_args(PrivacyConfig.model_fields["mechanism"].annotation)
    assert sorted(offered) == MECHANISMS.names()
