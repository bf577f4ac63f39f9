"""Knowledge inversion on real FMNIST: a briefly trained cnn_fmnist, a client's released class
representations, scored against its class mean images and the population's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from flcore.algorithms.base import ModelSpec, seeded
from flcore.algorithms.fedproto import client_prototypes
from flcore.algorithms.training import make_optimizer, train_epochs
from flcore.attacks import ATTACKS
from flcore.attacks.knowledge_inversion import (
    KnowledgeInversionProbe,
    class_mean_images,
    knowledge_scores,
)
from flcore.attacks.metrics import psnr, ssim
from flcore.data import ArrayDataset
from flcore.errors import ConfigError

SPEC = ModelSpec("cnn_fmnist", 10, 1)
STEPS = 100


@pytest.fixture(scope="module")
def setting(fmnist: Any) -> dict[str, Any]:
    """A cnn_fmnist trained 200 Adam steps on 3,200 real records; a 3,200-record population;
    a client of 30 other records and its exact (noise-free) released upload."""
    tr, info = fmnist.train, fmnist.info
    g = torch.Generator().manual_seed(0)
    idx = torch.randperm(len(tr.labels), generator=g)[:6430]
    pop = ArrayDataset(tr.images[idx[:6400]], tr.labels[idx[:6400]])
    client = ArrayDataset(tr.images[idx[6400:]], tr.labels[idx[6400:]])
    model = seeded((0,), SPEC)
    opt = make_optimizer(model.parameters(), name="adam", lr=1e-3)
    first = ArrayDataset(pop.images[:3200], pop.labels[:3200])
    train_epochs(model, first, info, opt, epochs=4, batch_size=64, generator=g)
    protos, counts = client_prototypes(model, client, info)
    upload = {k: v.clone() for k, v in model.state_dict().items()}
    upload |= {
        "knowledge.rep": protos,
        "knowledge.mask": (counts > 0).float(),
        "knowledge.counts": counts.float(),
    }
    exact = knowledge_scores(upload, SPEC, client, pop, info, steps=STEPS)
    return {"upload": upload, "client": client, "pop": pop, "info": info, "exact": exact}


def test_scores_are_on_unit_images_against_the_right_means(setting: dict[str, Any]) -> None:
    s, client, pop = setting["exact"], setting["client"], setting["pop"]
    shared = torch.nonzero(setting["upload"]["knowledge.mask"] > 0).flatten()
    assert torch.equal(s.classes, shared)
    assert float(s.images.min()) >= 0 and float(s.images.max()) <= 1
    truth, _ = class_mean_images(client, 10)
    base, _ = class_mean_images(pop, 10)
    # the truth is the client's class mean image, the baseline the population's
    for i, j in enumerate(shared.tolist()):
        on = client.labels == j
        torch.testing.assert_close(s.truth[i], client.images[on].float().mean(0) / 255)
        torch.testing.assert_close(s.baseline[i], pop.images[pop.labels == j].float().mean(0) / 255)
    torch.testing.assert_close(s.psnr_baseline, psnr(base[shared], truth[shared]))
    torch.testing.assert_close(s.ssim_baseline, ssim(base[shared], truth[shared]))
    m = s.metrics()
    assert m["knowledge_classes"] == len(shared)
    assert m["knowledge_psnr_gain"] >= 0 and m["knowledge_ssim_gain"] >= 0
    want = torch.clamp(s.psnr - s.psnr_baseline, min=0).mean()
    assert m["knowledge_psnr_gain"] == pytest.approx(float(want), abs=1e-5)


def test_the_optimiser_reduces_the_representation_distance(setting: dict[str, Any]) -> None:
    s = setting["exact"]
    assert float(s.distance_end.mean()) < 0.2 * float(s.distance_start.mean())


def test_the_exact_release_reconstructs_closer_than_a_noise_release(
    setting: dict[str, Any],
) -> None:
    """A release drowned in noise (sigma huge: the rows replaced by noise of the same norm)
    gives reconstructions farther from the client's class means than the exact release."""
    up = dict(setting["upload"])
    rep = up["knowledge.rep"]
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(rep.shape, generator=g)
    up["knowledge.rep"] = noise * rep.norm(dim=1, keepdim=True) / noise.norm(dim=1, keepdim=True)
    noised = knowledge_scores(
        up, SPEC, setting["client"], setting["pop"], setting["info"], steps=STEPS
    )
    exact = setting["exact"]
    assert float(noised.psnr.mean()) < float(exact.psnr.mean()) - 1.0
    assert noised.metrics()["knowledge_psnr_gain"] <= exact.metrics()["knowledge_psnr_gain"] + 0.5


def test_an_upload_without_knowledge_is_refused(setting: dict[str, Any]) -> None:
    weights = {k: v for k, v in setting["upload"].items() if not k.startswith("knowledge.")}
    with pytest.raises(ValueError, match="knowledge-sharing upload"):
        knowledge_scores(weights, SPEC, setting["client"], setting["pop"], setting["info"])


def test_config_accepts_it_only_for_knowledge_sharing_algorithms(data_root: Path) -> None:
    from flcore.config import validate_config

    base = {"data_root": str(data_root), "rounds": 2, "attack": {"name": "knowledge_inversion"}}
    validate_config(base | {"algorithm": "fedproto"})
    with pytest.raises(ConfigError, match="attack.name"):
        validate_config(base | {"algorithm": "fedavg"})
    with pytest.raises(ConfigError, match=r"attack\.tv"):
        ATTACKS.get("knowledge_inversion").validate({"tv": -1})


def test_the_probe_attacks_the_round_upload(data_root: Path) -> None:
    """As an engine probe on a 1-round FedProto run: the chosen client's shared classes are
    inverted and the round reports the knowledge metrics."""
    from flcore.attacks.evaluation import AttackSettings
    from flcore.experiment import build_engine
    from tests.unit.algorithms.test_flanc import make_cfg

    engine = build_engine(make_cfg(data_root, "fedproto", rounds=1, local_epochs=1))
    settings = AttackSettings("knowledge_inversion", (1,), (0,), params={"iterations": 5})
    probe = KnowledgeInversionProbe(settings, engine.factory)
    engine.probes = [probe]
    [result] = list(engine.iter_rounds())
    held = len(engine.data.client_train(0).labels.unique())
    assert result.metrics["knowledge_classes"] == held
    assert result.metrics["knowledge_psnr_gain"] >= 0
    summary = probe.summary(engine)
    assert summary["knowledge_classes"] == held and "knowledge_reason" not in summary
    restored = KnowledgeInversionProbe(settings, engine.factory)
    restored.load_state_dict(probe.state_dict())
    assert restored.summary(engine)["knowledge_psnr"] == summary["knowledge_psnr"]
    # the baseline is the other clients' class means: client 0's own records, the truth it is
    # scored against, are no part of the attacker's prior
    fed = engine.data
    own = set(np.asarray(fed.train.client_indices[0]).tolist())
    others = sorted(
        {int(i) for c, a in enumerate(fed.train.client_indices) if c != 0 for i in a} - own
    )
    idx = torch.as_tensor(others)
    pop = ArrayDataset(fed.splits.train.images[idx], fed.splits.train.labels[idx])
    truth, n = class_mean_images(fed.client_train(0), 10)
    base, _ = class_mean_images(pop, 10)
    held_classes = torch.nonzero(n > 0).flatten()
    expected = psnr(base[held_classes], truth[held_classes]).mean().item()
    assert summary["knowledge_psnr_baseline"] == pytest.approx(expected, abs=1e-4)
