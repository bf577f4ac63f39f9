"""The attacks on real FMNIST records: IG and DLG invert a one-record upload of a small model,
the pseudo-gradient of a one-step upload is the true gradient, HyperFL's matching in factored
form equals the plain one, and the tailored attack recovers HyperFL's embedding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flcore.algorithms.base import LocalTraining
from flcore.attacks import ATTACKS, HyperSurface, ModelSurface, Observation
from flcore.attacks.gradmatch import cosine_distance, l2_distance
from flcore.attacks.metrics import psnr
from flcore.config import validate_config
from flcore.data import DatasetSplits, normalize
from flcore.executor import one_torch_thread
from flcore.models import build_model
from flcore.models.base import SplitModel
from flcore.models.hypernet import HyperNetwork
from flcore.testing.attack_contract import observations


class SmallMLP(SplitModel):
    """A small model: one hidden layer of 32 sigmoid units."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Flatten(), nn.Linear(784, 32), nn.Sigmoid())
        self.head = nn.Linear(32, 10)


TRAINING = LocalTraining(epochs=1, batch_size=1, lr=0.1, momentum=0.5, weight_decay=5e-4)


def _observation(fmnist: DatasetSplits, index: int, labels: bool) -> Observation:
    """A real one-step, one-record FedAvg-style upload of SmallMLP (SGD with momentum and
    weight decay, as the clients train)."""
    torch.manual_seed(0)
    model = SmallMLP()
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    img, lab = fmnist.train.images[index : index + 1], fmnist.train.labels[index : index + 1]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5, weight_decay=5e-4)
    F.cross_entropy(model(normalize(img, fmnist.info)), lab).backward()
    opt.step()
    upload = {k: v.detach().clone() for k, v in model.named_parameters()}
    surface = ModelSurface(SmallMLP(), start, label_key="head.bias")
    return Observation(
        "fedavg",
        1,
        0,
        upload,
        start,
        surface,
        TRAINING,
        1,
        1,
        fmnist.info,
        (1, 28, 28),
        lab if labels else None,
    )


@pytest.mark.parametrize(("attack", "iterations"), [("ig", 300), ("dlg", 10)])
def test_ig_and_dlg_recover_a_real_record_from_its_gradient(
    fmnist: DatasetSplits, attack: str, iterations: int
) -> None:
    obs = _observation(fmnist, 0, labels=False)
    truth = fmnist.train.images[:1].float() / 255
    with one_torch_thread():
        rec = ATTACKS.create(attack, params={"iterations": iterations}).reconstruct(obs)
    assert rec.label_source == "idlg"
    assert int(rec.labels) == int(fmnist.train.labels[0])
    assert float(psnr(rec.images, truth)) > 25
    # and it is this record that came out, not any garment: another one scores low
    other = fmnist.train.images[1:2].float() / 255
    assert float(psnr(rec.images, other)) < 15


def test_without_an_uploaded_classifier_labels_must_be_given(fmnist: DatasetSplits) -> None:
    obs = _observation(fmnist, 0, labels=False)
    surface = ModelSurface(
        SmallMLP(), {k: v for k, v in obs.surface.start.items() if "head" not in k}
    )
    blind = Observation(**{**vars(obs), "surface": surface})
    with pytest.raises(ValueError, match="none were given"):
        ATTACKS.create("ig", params={"iterations": 1}).reconstruct(blind)


def test_a_one_step_uploads_pseudo_gradient_is_the_true_gradient(fmnist: DatasetSplits) -> None:
    obs = _observation(fmnist, 3, labels=True)
    x = normalize(fmnist.train.images[3:4], fmnist.info)
    y = fmnist.train.labels[3:4]
    true = obs.surface.gradient({}, x, y)
    target = obs.target()
    for k in true:
        torch.testing.assert_close(target[k], true[k], rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("rank_one", [True, False])
def test_hyperfl_matching_in_factored_form_equals_the_plain_one(rank_one: bool) -> None:
    torch.manual_seed(0)
    model = build_model("cnn_fmnist", num_classes=10, in_channels=1)
    hnet = HyperNetwork(
        {k: p.shape for k, p in model.features.named_parameters()}, embed_dim=8, hidden_dim=16
    )
    start = dict(hnet.state_dict())
    unknowns = {"embedding": torch.randn(8)} | {
        f"head.{k}": v.detach() for k, v in model.head.state_dict().items()
    }
    surface = HyperSurface(hnet, model, start, unknowns)
    if rank_one:  # a real one-record gradient (each head's weight target has rank one)
        target = surface.gradient(
            {**unknowns, "embedding": torch.randn(8)}, torch.randn(1, 1, 28, 28), torch.tensor([5])
        )
    else:
        target = {k: torch.randn_like(v) for k, v in start.items()}
    prepared = {k: v[0] for k, v in surface.prepare_targets([target]).items()}
    if rank_one:
        assert prepared["heads.4.weight.U"].shape[-1] == 1
    x, y = torch.randn(1, 1, 28, 28), torch.tensor([3])
    for distance in (cosine_distance, l2_distance):
        fast = surface.match(unknowns, x, y, prepared, distance)
        plain = distance(surface.gradient(unknowns, x, y), target)
        torch.testing.assert_close(fast, plain, rtol=1e-4, atol=1e-6)


def test_the_tailored_attack_recovers_hyperfls_embedding_and_runs_end_to_end(
    data_root: Path,
) -> None:
    raw = {
        "algorithm": "hyperfl",
        "data_root": str(data_root),
        "num_clients": 2,
        "global_test_per_class": 50,
        "samples_per_client": 40,
        "test_samples_per_client": 20,
        "rounds": 2,
        "local_epochs": 1,
        "batch_size": 20,
        "seed": 4,
        "workers": 1,
    }
    engine, task, obs, _ = observations(validate_config(raw), engine_data(raw))
    with one_torch_thread():
        rec = ATTACKS.create("hyperfl_tailored", params={"iterations": 20}).reconstruct(obs[0])
    true = task.state["embedding"]
    cos = F.cosine_similarity(rec.extra["embedding"], true, dim=0)
    assert float(cos) > 0.999  # stage 1 is exact for a one-step update
    assert rec.images.shape == (1, 1, 28, 28) and rec.label_source == "given"
    assert float(rec.images.min()) >= 0 and float(rec.images.max()) <= 1


def engine_data(raw: dict):  # type: ignore[no-untyped-def]
    from flcore.experiment import build_data

    return build_data(validate_config(raw))


@pytest.mark.parametrize("unknown_head", [False, True])
def test_an_interrupted_ig_run_resumes_to_the_uninterrupted_result(
    fmnist: DatasetSplits, tmp_path: Path, unknown_head: bool
) -> None:
    """IG's state saved mid-run (here after every iteration) and resumed after a crash gives
    the same images and unknowns, bit for bit, as a run never stopped; the optimisation
    crosses all three of the schedule's milestones (15, 25, 35 of 40) on the way."""
    from flcore.attacks.gradmatch import Problem
    from flcore.attacks.ig import run_adam

    obs = _observation(fmnist, 5, labels=True)
    surface = obs.surface
    if unknown_head:  # the head optimised with the images, as for HyperFL's private head
        start = {k: v for k, v in surface.start.items() if not k.startswith("head.")}
        head = {k: v for k, v in surface.start.items() if k.startswith("head.")}
        surface = ModelSurface(SmallMLP(), start, unknowns=head)
    target = {k: v for k, v in obs.target().items() if k in surface.start}

    def problem() -> Problem:
        return Problem(
            surface, [target], obs.labels[None], (1, 28, 28), obs.info, torch.device("cpu")
        )

    kw = {"iterations": 40, "lr": 0.1, "unknown_lr": 0.1, "tv": 1e-6, "signed": True}
    with one_torch_thread():
        whole = run_adam(problem(), boxed=True, **kw)
        crashing, state, calls = problem(), tmp_path / "ig.pt", [0]
        loss = crashing.loss

        def dies_at_23(*args):  # type: ignore[no-untyped-def]
            calls[0] += 1
            if calls[0] == 23:
                raise RuntimeError("killed")
            return loss(*args)

        crashing.loss = dies_at_23  # type: ignore[method-assign]
        with pytest.raises(RuntimeError, match="killed"):
            run_adam(crashing, boxed=True, resume=state, save_seconds=0, **kw)
        assert torch.load(state, weights_only=False)["iteration"] == 22
        resumed = run_adam(problem(), boxed=True, resume=state, save_seconds=0, **kw)
        # the ended run's state stays: solving the same problem again answers from it at once
        assert torch.load(state, weights_only=False)["iteration"] == 40
        again = problem()
        again.loss = lambda *args: pytest.fail("an ended run optimised again")  # type: ignore[method-assign]
        repeated = run_adam(again, boxed=True, resume=state, **kw)
    assert torch.equal(resumed[0], whole[0]) and torch.equal(repeated[0], whole[0])
    assert (
        resumed[1].keys()
        == whole[1].keys()
        == ({"head.weight", "head.bias"} if unknown_head else set())
    )
    for k in whole[1]:
        assert torch.equal(resumed[1][k], whole[1][k])
    assert not torch.equal(whole[0], problem().initial()[0].detach())  # it did optimise


def test_the_ig_attack_keeps_one_state_file_per_problem(
    fmnist: DatasetSplits, tmp_path: Path
) -> None:
    """With ``resume_dir`` set, each optimisation saves under a digest of its problem: a second
    reconstruction of the same upload is read back from the finished state (same images), and a
    different upload gets its own file."""
    attack = ATTACKS.create("ig", params={"iterations": 12})
    attack.resume_dir = tmp_path
    first, other = _observation(fmnist, 0, labels=True), _observation(fmnist, 1, labels=True)
    with one_torch_thread():
        a = attack.reconstruct(first)
        assert len(list(tmp_path.glob("ig-*.pt"))) == 1
        again = attack.reconstruct(first)
        attack.reconstruct(other)
    assert torch.equal(a.images, again.images)
    assert len(list(tmp_path.glob("ig-*.pt"))) == 2
    fresh = ATTACKS.create("ig", params={"iterations": 12})
    with one_torch_thread():
        assert torch.equal(fresh.reconstruct(first).images, a.images)
