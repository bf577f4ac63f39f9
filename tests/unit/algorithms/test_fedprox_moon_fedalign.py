"""FedProx's proximal gradient, MOON's contrastive loss and client state, FedAlign's Lipschitz
regulariser, and three rounds of each on real FMNIST."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from flcore.algorithms import ALGORITHMS, ClientData, ClientTask
from flcore.algorithms.fedalign import (
    fedalign_loss,
    find_last_block,
    lipschitz_estimate,
    sub_block_forward,
    transmission_matrix,
)
from flcore.algorithms.fedprox import proximal_step_hook
from flcore.algorithms.moon import model_contrastive_loss, moon_loss
from flcore.config import validate_config
from flcore.data import normalize
from flcore.errors import ConfigError
from flcore.executor import client_generator
from flcore.experiment import build_data, build_engine
from flcore.models import SplitModel, build_model
from tests.unit.algorithms.test_flanc import run_rounds


def make_cfg(data_root: Path, algorithm: str, **over: Any):  # type: ignore[no-untyped-def]
    """4 clients x 100 real FMNIST records, each split 75/25 into train/test (FedHKD's split)."""
    raw = {
        "algorithm": algorithm,
        "dataset": "fmnist",
        "data_root": str(data_root),
        "num_clients": 4,
        "global_test_per_class": 50,
        "samples_per_client": 100,
        "test_samples_per_client": 20,
        "client_split": {"train": 0.75, "test": 0.25},
        "rounds": 3,
        "local_epochs": 2,
        "batch_size": 20,
        "lr": 0.05,
        "workers": 1,
        "seed": 11,
    } | over
    return validate_config(raw)


@pytest.fixture(scope="module")
def fed(data_root: Path) -> Any:
    """The federated data every test here shares (the same layout for every algorithm)."""
    return build_data(make_cfg(data_root, "fedavg"))


def engine_for(data_root: Path, fed: Any, algorithm: str, **over: Any) -> Any:
    return build_engine(make_cfg(data_root, algorithm, **over), data=fed)


def one_update(engine: Any, cid: int = 0, state: Any = None, round: int = 1) -> Any:
    """Client ``cid``'s local update of ``round`` on the engine's current server model."""
    alg, fed = engine.algorithm, engine.data
    alg.begin_round(round, [cid])
    st = engine.client_states[cid] if state is None else state
    task = ClientTask(cid, round, alg.broadcast(round, cid), st, False, 11)
    data = ClientData(cid, fed.client_train(cid), fed.client_test(cid), fed.info)
    return alg.local_update(data, task, client_generator(11, round, cid))


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((a[k] - b[k]).pow(2).sum()) for k in a))


class Tiny(SplitModel):
    """features: Linear 3 -> 2 (the representation); head: Linear 2 -> 2."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Linear(3, 2)
        self.head = nn.Linear(2, 2)


# ---------------------------------------------------------------------------------- FedProx
def test_fedprox_step_adds_mu_times_the_distance_to_the_anchor() -> None:
    """One SGD step (lr 0.1, mu 0.5) from w = [1, -2], anchor [0, -1]: with a zero loss
    gradient, w - 0.1 * 0.5 * (w - anchor) = [0.95, -1.95]; with a CE gradient g, w - 0.1 (g +
    0.5 (w - anchor))."""
    w = nn.Parameter(torch.tensor([1.0, -2.0]))
    anchor = torch.tensor([0.0, -1.0])
    opt = torch.optim.SGD([w], lr=0.1)
    opt.register_step_pre_hook(proximal_step_hook([(w, anchor)], 0.5))
    w.grad = torch.zeros(2)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.tensor([0.95, -1.95]))

    model = nn.Linear(2, 2)
    x, y = torch.tensor([[1.0, 2.0], [-1.0, 0.5]]), torch.tensor([0, 1])
    start = {k: p.detach().clone() for k, p in model.named_parameters()}
    anchors = {k: v + 0.25 for k, v in start.items()}
    F.cross_entropy(model(x), y).backward()
    want = {
        k: p.detach() - 0.1 * (p.grad + 0.5 * (p.detach() - anchors[k]))
        for k, p in model.named_parameters()
    }
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pairs = [(p, anchors[k]) for k, p in model.named_parameters()]
    opt.register_step_pre_hook(proximal_step_hook(pairs, 0.5))
    opt.step()
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.detach(), want[k])


@pytest.mark.parametrize("privacy", [None, {"mechanism": "dpsgd", "noise_multiplier": 0.5}])
def test_fedprox_client_stays_closer_to_the_global_model(
    data_root: Path, fed: Any, privacy: Any
) -> None:
    """mu = 0 is FedAvg bitwise; a large mu keeps the upload near w^t, with DP-SGD too."""
    extra = {"privacy": privacy | {"clip": 1.0}} if privacy else {}
    moved = {}
    for alg, mu in [("fedavg", None), ("fedprox", 0.0), ("fedprox", 20.0)]:
        params = {} if mu is None else {"algorithm_params": {"mu": mu}}
        engine = engine_for(data_root, fed, alg, **params, **extra)
        start = engine.algorithm.broadcast(1, 0)
        up = one_update(engine).upload
        moved[(alg, mu)] = (distance(up, start), up)
    fedavg_up, plain_up = moved[("fedavg", None)][1], moved[("fedprox", 0.0)][1]
    assert all(torch.equal(fedavg_up[k], plain_up[k]) for k in fedavg_up)
    assert moved[("fedprox", 20.0)][0] < 0.5 * moved[("fedprox", 0.0)][0]


# ---------------------------------------------------------------------------------- MOON
def test_moon_contrastive_loss_by_hand() -> None:
    """tau 0.5. Record 1: cos(z, z_glob) = 1, cos(z, z_prev) = 0, l = log(1 + e^-2).
    Record 2: cos 1/sqrt 2 and -1, l = log(1 + e^(-2 - sqrt 2)) (2 sqrt 2 / 2 = sqrt 2)."""
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    z_glob = torch.tensor([[3.0, 0.0], [2.0, 0.0]])
    z_prev = torch.tensor([[0.0, 1.0], [-1.0, -1.0]])
    want = (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(-2.0 - math.sqrt(2.0)))) / 2
    got = model_contrastive_loss(z, z_glob, z_prev, 0.5)
    assert float(got) == pytest.approx(want, rel=1e-6)


def test_moon_loss_is_ce_in_value_and_ce_plus_mu_lcon_in_gradient() -> None:
    torch.manual_seed(0)
    model, glob, prev = Tiny(), Tiny(), Tiny()
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    loss = moon_loss(glob, prev, 0.7, 0.5)(model, x, y)
    loss.backward()
    got = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    ce = F.cross_entropy(model(x), y)
    assert float(loss.detach()) == pytest.approx(float(ce.detach()))
    lcon = model_contrastive_loss(
        model.features(x), glob.features(x).detach(), prev.features(x).detach(), 0.5
    )
    (ce + 0.7 * lcon).backward()
    for k, p in model.named_parameters():
        torch.testing.assert_close(got[k], p.grad)
    g_ce = torch.autograd.grad(F.cross_entropy(model(x), y), model.features.weight)[0]
    assert float((got["features.weight"] - g_ce).abs().sum()) > 0  # the term is not idle


def test_moon_first_participation_trains_as_fedavg(data_root: Path, fed: Any) -> None:
    """No previous model: the negative is the global model, the term has zero gradient."""
    ups = {}
    for alg in ("fedavg", "moon"):
        engine = engine_for(data_root, fed, alg)
        assert alg == "fedavg" or engine.client_states[0] == {}
        ups[alg] = one_update(engine).upload
    for k in ups["fedavg"]:
        torch.testing.assert_close(ups["moon"][k], ups["fedavg"][k])


def test_moon_previous_model_is_kept_used_and_survives_a_checkpoint(
    data_root: Path, fed: Any, tmp_path: Path
) -> None:
    cfg = make_cfg(data_root, "moon", rounds=2, client_fraction=0.5, eval_every=1)
    first = build_engine(cfg, data=fed)
    rounds = first.iter_rounds()
    r1 = next(rounds)
    rounds.close()
    cid = r1.client_ids[0]
    kept = first.client_states[cid]
    server = first.algorithm.model.state_dict()
    assert set(kept) == set(server)
    assert any(not torch.equal(kept[k], server[k]) for k in server)  # its own model, not w
    path = first.save_checkpoint(tmp_path / "moon.pt")

    resumed = build_engine(cfg, data=fed)
    resumed.load_checkpoint(path)
    for c, state in first.client_states.items():
        assert state.keys() == resumed.client_states[c].keys()
        assert all(torch.equal(state[k], resumed.client_states[c][k]) for k in state)
    # the kept model is what round 2 contrasts with: dropping it changes the update
    with_prev = one_update(resumed, cid, round=2).upload
    without = one_update(resumed, cid, state={}, round=2).upload
    assert any(not torch.equal(with_prev[k], without[k]) for k in with_prev)


# ---------------------------------------------------------------------------------- FedAlign
def test_transmission_matrix_and_lipschitz_estimate_by_hand() -> None:
    """Input: one pixel per channel on a 4 x 4 map, pooled to 2 x 2 (0.25 in cells 0 and 1):
    A = [[.25, 0, 0, 0], [0, .25, 0, 0]]; output B = [[2, 0, 0, 0], [0, 3, 0, 0]];
    T = A B^T / 4 = diag(0.125, 0.1875), whose top singular value is 0.1875."""
    fm_in = torch.zeros(1, 2, 4, 4)
    fm_in[0, 0, 0, 0] = 1.0  # pooled: 0.25 at (0, 0)
    fm_in[0, 1, 0, 2] = 1.0  # pooled: 0.25 at (0, 1)
    fm_out = torch.zeros(1, 2, 2, 2)
    fm_out[0, 0, 0, 0], fm_out[0, 1, 0, 1] = 2.0, 3.0
    tm = transmission_matrix(fm_in, fm_out)
    torch.testing.assert_close(tm[0], torch.tensor([[0.125, 0.0], [0.0, 0.1875]]))
    assert float(lipschitz_estimate(tm, 30)[0]) == pytest.approx(0.1875, rel=1e-5)
    # a general matrix: the estimate is the top singular value
    torch.manual_seed(0)
    t = torch.randn(3, 4, 6)
    want = torch.linalg.matrix_norm(t, ord=2)
    torch.testing.assert_close(lipschitz_estimate(t, 200), want, rtol=1e-4, atol=1e-5)


def test_the_sub_block_is_the_first_quarter_of_the_last_convolution() -> None:
    """cnn_fmnist's last block is conv 16 -> 32 + LeakyReLU; on an input whose channels past
    the first 4 are zero, the sub-block's 8 outputs are the full block's first 8."""
    model = build_model("cnn_fmnist", num_classes=10, in_channels=1)
    block = find_last_block(model)
    assert block.conv is model.features[3] and block.act is model.features[4]
    torch.manual_seed(1)
    x = torch.randn(2, 16, 12, 12)
    x[:, 4:] = 0
    full = block.act(block.conv(x))
    sub = sub_block_forward(block, x[:, :4], 0.25)
    assert sub.shape == (2, 8, 10, 10)
    torch.testing.assert_close(sub, full[:, :8])


def test_fedalign_loss_value_is_ce_and_its_extra_gradient_is_the_balanced_regulariser(
    fmnist: Any,
) -> None:
    model = build_model("cnn_fmnist", num_classes=10, in_channels=1)
    block = find_last_block(model)
    x, y = normalize(fmnist.train.images[:16], fmnist.info), fmnist.train.labels[:16]
    loss = fedalign_loss(block, 0.45, 0.25, 10)(model, x, y)
    loss.backward()
    got = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    ce = F.cross_entropy(model(x), y)
    assert float(loss.detach()) == pytest.approx(float(ce.detach()))
    ce.backward()
    extra = {k: got[k] - p.grad for k, p in model.named_parameters()}
    # only the sub-block's weights (first 8 filters over the first 4 channels) are regularised
    w = extra.pop("features.3.weight")
    assert float(w[:8, :4].abs().sum()) > 0
    assert float(w[8:].abs().sum()) == 0 and float(w[:, 4:].abs().sum()) == 0
    assert float(extra.pop("features.3.bias")[8:].abs().sum()) == 0
    assert all(float(g.abs().sum()) < 1e-6 for g in extra.values())
    # balanced: the extra gradient is mu * CE / L_reg * grad L_reg, computed directly
    model.zero_grad()
    seen = {}
    h = block.conv.register_forward_pre_hook(lambda m, a: seen.__setitem__("in", a[0]))
    model(x)
    h.remove()
    x_in = seen["in"].detach()
    target = lipschitz_estimate(transmission_matrix(x_in, block.act(block.conv(x_in))), 10)
    sub = lipschitz_estimate(
        transmission_matrix(x_in[:, :4], sub_block_forward(block, x_in[:, :4], 0.25)), 10
    )
    reg = F.mse_loss(sub, target.detach())
    (0.45 * float(ce.detach()) / float(reg.detach()) * reg).backward()
    torch.testing.assert_close(w, model.features[3].weight.grad, rtol=1e-4, atol=1e-7)


def test_fedalign_refuses_a_model_without_convolutions() -> None:
    with pytest.raises(ConfigError, match="fedalign needs a convolution"):
        find_last_block(Tiny())


# ---------------------------------------------------------------------------------- all three
@pytest.mark.parametrize(
    ("algorithm", "key", "value"),
    [("fedprox", "mu", -1.0), ("moon", "tau", 0.0), ("fedalign", "width", 1.5)],
)
def test_bad_params_name_the_key(algorithm: str, key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"algorithm_params.{key}"):
        ALGORITHMS.get(algorithm).validate_params({key: value})


@pytest.mark.parametrize("algorithm", ["moon", "fedalign"])
def test_client_level_dp_only(algorithm: str) -> None:
    """Client-level DP composes with any local objective; DP-SGD would drop the added term."""
    base = {"algorithm": algorithm, "client_fraction": 0.5}
    validate_config(base | {"privacy": {"mechanism": "client", "noise_multiplier": 1.0}})
    with pytest.raises(ConfigError, match="privacy"):
        validate_config(base | {"privacy": {"mechanism": "dpsgd", "noise_multiplier": 1.0}})


@pytest.mark.parametrize("algorithm", ["fedprox", "moon", "fedalign"])
def test_three_rounds_on_fmnist_improve_local_accuracy(
    data_root: Path, fed: Any, algorithm: str
) -> None:
    """FedHKD's optimizer (Adam, lr 1e-3) on a small FMNIST subset."""
    over = {"lr": 1e-3, "optimizer": {"name": "adam"}, "local_epochs": 3}
    rounds = run_rounds(engine_for(data_root, fed, algorithm, **over), 3)
    assert rounds[0]["accuracy_before"] < 0.3
    assert rounds[-1]["accuracy"] > rounds[0]["accuracy_before"] + 0.3
    assert rounds[-1]["accuracy_before"] > rounds[0]["accuracy_before"] + 0.15  # w^t learns too
