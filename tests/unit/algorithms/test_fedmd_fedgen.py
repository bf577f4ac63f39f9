"""FedMD and FedGen (FedHKD's distillation baselines), and the public set FedMD distils on:
hand-made aggregation and losses, disjointness of the public set, refusals, and three rounds of
each on real FMNIST."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from flcore.algorithms import ClientData, ClientResult, ClientTask, LocalTraining, ModelSpec
from flcore.algorithms.base import seeded
from flcore.algorithms.fedgen import (
    COUNTS,
    GEN,
    GEN_LABELS,
    FedGen,
    _decayed,
    diversity_loss,
    generator_regularizer,
    label_weights,
)
from flcore.algorithms.fedmd import CONSENSUS, LOGITS, FedMD, PublicBatches, digest_loss
from flcore.config import validate_config
from flcore.data import DatasetSplits, FederatedData, build_federated_data
from flcore.errors import ConfigError
from flcore.executor import client_generator
from flcore.experiment import build_engine

SPEC = ModelSpec("cnn_fmnist", num_classes=10, in_channels=1)
ADAM = LocalTraining(epochs=1, batch_size=20, lr=1e-3, optimizer="adam", weight_decay=0.0)


def _fedhkd_layout(fmnist: DatasetSplits, seed: int, public: int | None) -> FederatedData:
    """FedHKD's protocol: 10 clients x 600 Dirichlet(0.5) records, each split 75/25."""
    return build_federated_data(
        fmnist,
        num_clients=10,
        samples_per_client=600,
        test_samples_per_client=None,
        partition="dirichlet",
        partition_params={"beta": 0.5},
        seed=seed,
        client_split=(0.75, 0.0, 0.25),
        public_samples=public,
    )


def _held(data: FederatedData) -> np.ndarray:
    """Every train-split index some client holds (train, and under a client split its
    validation and test records; otherwise its test records come from the test split)."""
    parts = list(data.train.client_indices)
    if data.test_source == "train":
        parts += list(data.test.client_indices)
    parts += list(data.val.client_indices) if data.val is not None else []
    return np.unique(np.concatenate(parts))


# ------------------------------------------------------------------------------ the public set
def test_public_set_is_disjoint_from_every_client_sized_and_seeded(fmnist: DatasetSplits) -> None:
    data = _fedhkd_layout(fmnist, seed=2, public=450)
    plain = _fedhkd_layout(fmnist, seed=2, public=None)

    assert data.public is not None and data.public.size == 450
    assert np.unique(data.public).size == 450
    assert np.intersect1d(data.public, _held(data)).size == 0  # no client's train/val/test
    assert data.test_source == "train"  # the clients' test records come from the train split
    for a, b in zip(data.train.client_indices, plain.train.client_indices, strict=True):
        assert np.array_equal(a, b)  # the clients' records do not depend on the public set
    public = data.public_set()
    assert public is not None and len(public) == 450
    assert torch.equal(public.images, fmnist.train.images[torch.tensor(data.public)])
    assert plain.public is None and plain.public_set() is None
    again, other = _fedhkd_layout(fmnist, 2, 450), _fedhkd_layout(fmnist, 3, 450)
    assert again.public is not None and np.array_equal(again.public, data.public)
    assert other.public is not None and not np.array_equal(other.public, data.public)


def test_public_set_takes_only_records_no_client_holds_when_classes_run_out(
    fmnist: DatasetSplits,
) -> None:
    """12 x 5000 Dirichlet(0.1) records exhaust classes (the cursors wrap and reuse records);
    the public set still comes only from what nobody holds, and one record more is refused."""

    def build(public: int | None) -> FederatedData:
        return build_federated_data(
            fmnist,
            num_clients=12,
            samples_per_client=5000,
            test_samples_per_client=10,
            partition="dirichlet",
            partition_params={"beta": 0.1},
            seed=0,
            public_samples=public,
        )

    plain = build(None)
    assert plain.overlap["train_reused"] > 0
    free = len(fmnist.train) - _held(plain).size
    assert free > 0
    data = build(free)
    assert data.public is not None and data.public.size == free
    assert np.intersect1d(data.public, _held(data)).size == 0
    with pytest.raises(ConfigError, match="public_samples") as err:
        build(free + 1)
    assert err.value.key == "public_samples" and f"only {free} of the" in str(err.value)


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"public_samples": 59_700}, "only 59600 of the 60000 training records are left"),
        ({"public_samples": 0}, "public_samples"),
        ({}, "fedmd distils on a public set: set public_samples"),
    ],
)
def test_bad_public_set_exits_2_before_any_work(
    tiny_config: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, over: dict, needle: str
) -> None:
    from typer.testing import CliRunner

    from sweeps.cli import app

    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config | {"algorithm": "fedmd"} | over))
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    result = CliRunner().invoke(app, ["run", str(cfg), "--json"], env=env)
    assert result.exit_code == 2
    assert needle in " ".join(result.output.split())
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


# -------------------------------------------------------------------------------------- FedMD
def _const_upload(value: float, **extra: torch.Tensor) -> dict[str, torch.Tensor]:
    state = seeded((0, 0x1417), SPEC).state_dict()
    return {k: torch.full_like(v, value) for k, v in state.items()} | extra


def test_fedmd_consensus_is_the_plain_mean_and_the_model_the_weighted_mean() -> None:
    """A (n 1) uploads 1 and logits L_A, B (n 3) uploads 5 and L_B: model (1 + 15) / 4 = 4,
    consensus (L_A + L_B) / 2 whatever the sizes; round 2 broadcasts both; a checkpoint
    carries the consensus."""
    alg = FedMD(model_spec=SPEC, training=ADAM, num_clients=2)
    alg.init_server()
    assert CONSENSUS not in alg.broadcast(1, 0)  # round 1: no consensus yet
    la, lb = torch.tensor([[1.0, 2.0], [3.0, -4.0]]), torch.tensor([[3.0, 0.0], [1.0, 0.0]])
    alg.begin_round(1, [0, 1])
    alg.accumulate(ClientResult(0, 1, _const_upload(1.0, **{LOGITS: la})))
    alg.accumulate(ClientResult(1, 3, _const_upload(5.0, **{LOGITS: lb})))
    alg.end_round(1)
    sent = alg.broadcast(2, 1)
    assert torch.equal(sent[CONSENSUS], torch.tensor([[2.0, 1.0], [2.0, -2.0]]))
    weight = sent["head.weight"]
    assert torch.equal(weight, torch.full_like(weight, 4.0))
    fresh = FedMD(model_spec=SPEC, training=ADAM, num_clients=2)
    fresh.init_server()
    fresh.load_state_dict(alg.state_dict())
    assert torch.equal(fresh.broadcast(2, 0)[CONSENSUS], sent[CONSENSUS])


def test_digest_loss_is_ce_plus_lambda_times_the_squared_gap_on_a_public_batch() -> None:
    model = nn.Linear(2, 3)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, -1.0], [0.5, 2.0], [0.0, 1.0]]))
        model.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    public_x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, -1.0]])
    consensus = torch.tensor([[1.0, 1.0, 1.0], [0.0, 2.0, 1.0], [3.0, 0.0, -1.0]])
    x, y = torch.tensor([[0.5, 0.5], [1.0, -2.0]]), torch.tensor([2, 0])

    got = digest_loss(public_x, consensus, 0.05, PublicBatches(3, torch.Generator().manual_seed(4)))
    value = got(model, x, y)

    idx = torch.randperm(3, generator=torch.Generator().manual_seed(4))[:2]
    gap = (model(public_x[idx]) - consensus[idx]).pow(2).sum(1).mean()
    want = F.cross_entropy(model(x), y) + 0.05 * gap
    torch.testing.assert_close(value, want)
    # every public record once per pass, then a fresh shuffle
    batches = PublicBatches(3, torch.Generator().manual_seed(1))
    first = torch.cat([batches.take(2), batches.take(2)])
    assert sorted(first[:3].tolist()) == [0, 1, 2]
    with pytest.raises(ValueError, match="empty"):
        PublicBatches(0, torch.Generator())


def test_fedmd_refuses_to_run_without_a_public_set(fmnist: DatasetSplits) -> None:
    with pytest.raises(ConfigError) as err:
        validate_config({"algorithm": "fedmd"})
    assert err.value.key == "public_samples"
    alg = FedMD(model_spec=SPEC, training=ADAM, num_clients=1)
    data = _fedhkd_layout(fmnist, seed=0, public=None)
    cdata = ClientData(0, data.client_train(0), data.client_test(0), data.info)
    task = ClientTask(0, 1, seeded((0, 0x1417), SPEC).state_dict(), None, False, 0)
    with pytest.raises(ConfigError, match="needs a public set"):
        alg.local_update(cdata, task, client_generator(0, 1, 0))


def _cfg(data_root: Path, algorithm: str, **over: Any):  # type: ignore[no-untyped-def]
    """FedHKD's protocol in small: 4 clients x 100 Dirichlet(0.5) FMNIST records split 75/25,
    Adam 1e-3, 3 rounds of 2 epochs."""
    raw = {
        "algorithm": algorithm,
        "dataset": "fmnist",
        "data_root": str(data_root),
        "num_clients": 4,
        "samples_per_client": 100,
        "client_split": {"train": 0.75, "test": 0.25},
        "partition": {"name": "dirichlet", "beta": 0.5},
        "global_test_per_class": 20,
        "rounds": 3,
        "local_epochs": 2,
        "batch_size": 20,
        "lr": 1e-3,
        "optimizer": {"name": "adam", "weight_decay": 0.0},
        "workers": 1,
        "seed": 3,
    } | over
    return validate_config(raw)


def _rounds(cfg: Any) -> list[dict[str, Any]]:
    return [r.metrics for r in build_engine(cfg).iter_rounds()]


def test_fedmd_three_rounds_learn_and_digest_from_round_two(data_root: Path) -> None:
    rounds = _rounds(_cfg(data_root, "fedmd", public_samples=75))
    assert rounds[0]["accuracy_before"] < 0.3
    assert rounds[-1]["accuracy"] > rounds[0]["accuracy_before"] + 0.2
    assert rounds[-1]["global_accuracy"] > 0.2
    # the upload is the model plus 75 x 10 float32 logits per client
    fedavg = _rounds(_cfg(data_root, "fedavg", rounds=1))
    assert rounds[0]["round_bytes_up"] - fedavg[0]["round_bytes_up"] == 4 * 75 * 10 * 4
    # round 1 has no consensus (lambda is unused); round 2 digests it
    plain = _cfg(data_root, "fedmd", public_samples=75, rounds=2, algorithm_params={"lam": 0})
    no_digest = _rounds(plain)
    assert no_digest[0]["train_loss"] == rounds[0]["train_loss"]
    assert no_digest[1]["train_loss"] != rounds[1]["train_loss"]


# ------------------------------------------------------------------------------------- FedGen
def test_label_weights_diversity_and_decay_by_hand() -> None:
    counts = torch.tensor([[3.0, 0.0, 1.0], [1.0, 0.0, 1.0]])  # 2 clients x 3 labels
    want = torch.tensor([[0.75, 0.25], [0.0, 0.0], [0.5, 0.5]])
    torch.testing.assert_close(label_weights(counts), want)
    # pairs (0, 1): noise 2^2 / 1 = 4, latents (1 + 3) / 2 = 2 -> mean over 4 pairs of 8, 0
    eps, z = torch.tensor([[0.0], [2.0]]), torch.tensor([[0.0, 0.0], [1.0, 3.0]])
    assert float(diversity_loss(eps, z)) == pytest.approx(math.exp(-4.0))
    assert _decayed(10.0, 0.98, 1) == 10.0
    assert _decayed(10.0, 0.98, 3) == pytest.approx(10.0 * 0.98**2)
    assert _decayed(1e-3, 0.5, 40) == 1e-4  # the authors' floor


def test_fedgen_generator_loss_uses_each_clients_own_head() -> None:
    """Two clients with different heads and label counts: L_G is the hand-weighted sum of each
    head's CE, not one head's CE twice (FL-bench's bug)."""
    alg = FedGen(model_spec=SPEC, training=ADAM, num_clients=2, params={"diversity": 0.0})
    alg.init_server()
    alg.begin_round(1, [0, 1])
    torch.manual_seed(0)
    heads = [(torch.randn(10, 128), torch.randn(10)) for _ in range(2)]
    counts = [torch.zeros(10), torch.zeros(10)]
    counts[0][[0, 1, 2]] = torch.tensor([5.0, 1.0, 2.0])
    counts[1][[1, 2, 3]] = torch.tensor([3.0, 2.0, 4.0])
    for cid, ((w, b), n) in enumerate(zip(heads, counts, strict=True)):
        upload = _const_upload(0.0, **{"head.weight": w, "head.bias": b, COUNTS: n})
        alg.accumulate(ClientResult(cid, 10, upload))
    y = torch.tensor([0, 1, 2, 3, 1, 2])
    eps = torch.randn(6, alg.generator.noise_dim)

    got = alg.generator_loss(alg._teachers, eps, y)

    z = alg.generator(eps, y).detach()
    share = {0: (1.0, 0.0), 1: (0.25, 0.75), 2: (0.5, 0.5), 3: (0.0, 1.0)}
    want = torch.zeros(())
    for k, (w, b) in enumerate(heads):
        ce = F.cross_entropy(z @ w.T + b, y, reduction="none")
        want = want + sum(share[int(c)][k] * ce[i] for i, c in enumerate(y)) / len(y)
    torch.testing.assert_close(got.detach(), want)
    w0, b0 = heads[0]
    one_head = F.cross_entropy(z @ w0.T + b0, y)  # a single head as every teacher
    assert not torch.isclose(got.detach(), one_head, rtol=1e-3)


class _Tiny(nn.Module):
    """Identity features, a linear head: enough for the client objective by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


class _FixedGen(nn.Module):
    noise_dim = 2

    def forward(self, eps: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return eps + y[:, None].float()


def test_fedgen_client_objective_by_hand() -> None:
    """CE + (B_g / B) alpha CE(h(G(eps', y')), y') + beta KL(softmax h(G(eps, y)) || f(x))."""
    torch.manual_seed(1)
    model, gen = _Tiny(), _FixedGen()
    x, y, labels = torch.randn(4, 2), torch.tensor([0, 1, 2, 1]), torch.tensor([0, 2])

    got = generator_regularizer(gen, labels, 3.0, 2.0, 5, 4, torch.Generator().manual_seed(9))
    value = got(model, x, y)

    rng = torch.Generator().manual_seed(9)  # the same draws, in the objective's order
    eps = torch.randn(4, 2, generator=rng)
    y_gen = labels[torch.randint(2, (5,), generator=rng)]
    eps_gen = torch.randn(5, 2, generator=rng)
    logits = model(x)
    target = F.softmax(model.head(gen(eps, y)), 1).detach()
    kl = (target * (target.log() - F.log_softmax(logits, 1))).sum(1).mean()
    teacher = F.cross_entropy(model.head(gen(eps_gen, y_gen)), y_gen)
    want = F.cross_entropy(logits, y) + 5 / 4 * 3.0 * teacher + 2.0 * kl
    torch.testing.assert_close(value, want)


def test_fedgen_three_rounds_learn_with_a_generator_from_round_two(data_root: Path) -> None:
    engine = build_engine(_cfg(data_root, "fedgen"))
    alg = engine.algorithm
    assert isinstance(alg, FedGen)
    initial = {k: v.clone() for k, v in alg.generator.state_dict().items()}
    assert not any(k.startswith(GEN) for k in alg.broadcast(1, 0))  # nothing to use yet
    rounds = []
    for result in engine.iter_rounds():
        rounds.append(result.metrics)
        if result.round == 1:
            sent = alg.broadcast(2, 0)
            trained = {k[len(GEN) :]: v for k, v in sent.items() if k.startswith(GEN)}
            assert trained.keys() == initial.keys()
            assert not torch.equal(trained["out.weight"], initial["out.weight"])
            assert sent[GEN_LABELS].dtype == torch.bool and bool(sent[GEN_LABELS].any())
    assert rounds[0]["accuracy_before"] < 0.3
    assert rounds[-1]["accuracy"] > rounds[0]["accuracy_before"] + 0.2
    # round 1 trains CE only; from round 2 the generator terms (alpha_2 = 9.8) dominate
    assert rounds[0]["train_loss"] < 2.5 < rounds[1]["train_loss"]
    assert rounds[1]["round_bytes_down"] > rounds[0]["round_bytes_down"]  # the generator
