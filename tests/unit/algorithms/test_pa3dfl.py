"""Pa3dFL on real FMNIST: the decomposed layers, pruning by width, the hypernetwork's server step
(Eqs. 7-8), training over rounds, and Algorithm 1's model selection."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flcore.algorithms.widths.pa3dfl  # noqa: F401  (registers)
from flcore.algorithms.base import ClientData, ClientResult, ClientTask, LocalTraining, ModelSpec
from flcore.algorithms.training import evaluate
from flcore.algorithms.widths.decomposed import (
    DecomposedConv2d,
    DecomposedLinear,
    LayerPlan,
    ranks,
    recover,
    recover_flanc,
    recover_weight,
)
from flcore.algorithms.widths.flanc import compose
from flcore.algorithms.widths.pa3dfl import Pa3dFL, interpolate, select_alpha, two_head_loss
from flcore.algorithms.widths.slicing import leading_block, padded
from flcore.callbacks import Callback
from flcore.capacity import Capacity
from flcore.config import validate_config
from flcore.data import ArrayDataset, normalize
from flcore.errors import ConfigError
from flcore.executor import client_generator, resolve_executor
from flcore.experiment import build_engine

SPEC = ModelSpec("pa3dfl_cnn_fmnist", 10, 1)
#: a tiny hypernetwork; two power-iteration steps per balanced step size (20 by default: the
#: iterations dominated these tests' start-up) where a test does not judge the step sizes
TINY = {"embed_dim": 4, "hidden_dim": 8, "encoder_depth": 2, "power_iterations": 2}


def _alg(ratios: tuple[float, ...], **params: object) -> Pa3dFL:
    alg = Pa3dFL(
        model_spec=SPEC,
        training=LocalTraining(1, 20, 0.05),
        num_clients=len(ratios),
        params=TINY | params,
        seed=2,
        capacity=Capacity(ratios),
    )
    alg.init_server()
    return alg


def _factor(w: torch.Tensor, r1: int, r2: int) -> tuple[torch.Tensor, torch.Tensor]:
    """U ``[R1, k^2, R2]`` and V ``[J, R2, S]`` with U V = W's channel-aware reshaping, from
    an SVD of the ``k^2 R1 x J S`` matrix (exact when its rank is at most R2)."""
    t, s = w.shape[:2]
    kk = w[0, 0].numel()
    j = t // r1
    # M[(i, a), (j, s)] = W[j R1 + i, s, a]
    m = w.reshape(j, r1, s, kk).permute(1, 3, 0, 2).reshape(r1 * kk, j * s).double()
    left, _, _ = torch.linalg.svd(m, full_matrices=False)
    left = left[:, :r2]
    u = torch.cat([left, left.new_zeros(left.shape[0], r2 - left.shape[1])], 1)
    v = u.t() @ m
    return u.reshape(r1, kk, r2).float(), v.reshape(r2, j, s).permute(1, 0, 2).float()


def test_the_decomposition_reproduces_full_layers(fmnist) -> None:  # type: ignore[no-untyped-def]
    # Prepare: arbitrary weights; the reshaped conv1 (50 x 16) and fc2 (8 x 8192) have rank <= R2
    gen = torch.Generator().manual_seed(0)
    x = normalize(fmnist.train.images[:32], fmnist.info)
    w_conv, b_conv = torch.randn(32, 1, 5, 5, generator=gen), torch.randn(32, generator=gen)
    r1, r2 = ranks("conv", 32, 1, 5, 1 / 16)
    assert (r1, r2) == (2, 25)  # Eq. 5: R1 = T p_min, R2 = max(min(S, T), k^2)
    conv = nn.Conv2d(1, 32, 5, padding=2)
    layer = DecomposedConv2d(LayerPlan(0, "conv", 32, 1, 5, r1, r2, 32, 1), conv)
    w_lin, b_lin = torch.randn(128, 512, generator=gen), torch.randn(128, generator=gen)
    l1, l2 = ranks("linear", 128, 512, 1, 1 / 16)
    assert (l1, l2) == (8, 8)
    lin = DecomposedLinear(LayerPlan(9, "linear", 128, 512, 1, l1, l2, 128, 512))
    h = torch.randn(32, 512, generator=gen)
    # Execute
    with torch.no_grad():
        for dec, w, b, r in ((layer, w_conv, b_conv, (r1, r2)), (lin, w_lin, b_lin, (l1, l2))):
            u, v = _factor(w, *r)
            dec.U.copy_(u)
            dec.V.copy_(v)
            dec.bias.copy_(b)
        out_conv, out_lin = layer(x), lin(h)
    # Assert: the decomposed layers compute the full layers
    torch.testing.assert_close(
        out_conv, F.conv2d(x, w_conv, b_conv, padding=2), atol=1e-4, rtol=1e-4
    )
    torch.testing.assert_close(out_lin, F.linear(h, w_lin, b_lin), atol=1e-4, rtol=1e-4)
    # channel c = j R1 + i is u_i v_j
    u, v = _factor(w_conv, r1, r2)
    c = 5 * r1 + 1
    torch.testing.assert_close((u[1] @ v[5]).t().reshape(1, 5, 5), w_conv[c], atol=1e-4, rtol=0)


def test_pruning_keeps_exactly_the_first_channels(fmnist) -> None:  # type: ignore[no-untyped-def]
    alg = _alg((1.0, 0.25, 0.0625))
    full_plans = alg.plans(1.0)
    x = normalize(fmnist.train.images[:8], fmnist.info)
    with torch.no_grad():
        for cid, width in ((1, 0.5), (2, 0.25)):
            # Prepare: the client's full-width generation and its recovered weights
            full = alg.hn(cid, full_plans, 128)
            w_full = {
                q.key: recover_weight(alg.U[f"{q.key}.U"], full[f"{q.key}.V"], q.kind)
                for q in full_plans
            }
            big = alg.build_net(1.0)
            big.load_state_dict(alg.U | full, strict=False)
            # Execute: what the server sends at the client's width
            pruned = alg.broadcast(1, cid)
            net = alg.build_net(width)
            net.load_state_dict(pruned, strict=False)
            # Assert
            plain = SPEC(width=width)
            plain.load_state_dict(net.recovered_state("local"))  # the width-p network's shapes
            for q in alg.plans(width):
                assert (q.T_p, q.J_p) == (round(q.T * width), round(16 * width))
                # Eq. 10: v_j for j < p T / R1, each on its first p S inputs
                v = full[f"{q.key}.V"]
                torch.testing.assert_close(pruned[f"{q.key}.V"], v[: q.J_p, :, : q.S_p])
                torch.testing.assert_close(pruned[f"{q.key}.bias"], full[f"{q.key}.bias"][: q.T_p])
                # the recovered width-p weight is the full one on the first p T channels and on
                # the previous layer's kept channels (fc1: the first p 64 blocks of 49 inputs)
                w_p = net.features[q.index].weight()
                torch.testing.assert_close(w_p, w_full[q.key][: q.T_p, : q.S_p])
            torch.testing.assert_close(
                pruned["local_head.weight"], full["local_head.weight"][:, : round(128 * width)]
            )
            # the width-p network is the full one with the other channels cut out: cut them
            # from the full network (every layer's inputs past the kept ones) and compare
            for q in alg.plans(width):
                big.features[q.index].V[:, :, q.S_p :] = 0
            big.local_head.weight[:, round(128 * width) :] = 0
            for end in (3, 6, 9, 11):
                small_out = net.features[:end](x)
                torch.testing.assert_close(
                    small_out, big.features[:end](x)[:, : small_out.shape[1]], atol=1e-5, rtol=1e-4
                )
            torch.testing.assert_close(
                net.local_head(net.features(x)),
                big.local_head(big.features(x)),
                atol=1e-5,
                rtol=1e-4,
            )


def test_flancs_decomposition_is_eq_3_and_prunes_to_the_first_channels(fmnist) -> None:  # type: ignore[no-untyped-def]
    """The ablation's scheme: FLANC's R1 and R2, Eq. 3's composition (flanc.compose, the
    baseline's own), and the width-p network the full one's on its first channels."""
    alg = _alg((1.0, 0.25, 0.0625), decomposition="flanc")
    full_plans = alg.plans(1.0)
    assert [(q.R1, q.R2, q.block) for q in full_plans] == [
        (1, 25, 1),
        (2, 32, 1),
        (4, 64, 49),
        (32, 32, 1),
    ]  # flanc.py's documented ranks for pa3dfl_cnn_fmnist at p_min 1/16
    gen = torch.Generator().manual_seed(1)
    for q in full_plans:
        u, v = torch.randn(q.u_shape(), generator=gen), torch.randn(q.v_shape(), generator=gen)
        # V's column o G + g is output channel o's coefficients over input group g
        coef = v.permute(1, 0, 2).reshape(q.R2, -1)
        expected = compose(u.reshape(-1, q.R2), coef, q.T, q.S // q.block, q.R1)
        torch.testing.assert_close(recover(q, u, v).reshape(q.T, -1), expected)
    x = normalize(fmnist.train.images[:8], fmnist.info)
    with torch.no_grad():
        for cid, width in ((1, 0.5), (2, 0.25)):
            full = alg.hn(cid, full_plans, 128)
            pruned = alg.broadcast(1, cid)
            net = alg.build_net(width)
            net.load_state_dict(pruned, strict=False)
            big = alg.build_net(1.0)
            big.load_state_dict(alg.U | full, strict=False)
            for q in alg.plans(width):
                groups = q.S_p // (q.block * q.R1)
                assert pruned[f"{q.key}.V"].shape == (q.T_p, q.R2, groups)
                torch.testing.assert_close(
                    pruned[f"{q.key}.V"], full[f"{q.key}.V"][: q.T_p, :, :groups]
                )
                w_full = recover_flanc(alg.U[f"{q.key}.U"], full[f"{q.key}.V"], q.kind, q.k)
                torch.testing.assert_close(net.features[q.index].weight(), w_full[: q.T_p, : q.S_p])
                big.features[q.index].V[:, :, groups:] = 0  # cut the inputs past the kept ones
            big.local_head.weight[:, round(128 * width) :] = 0
            for end in (3, 6, 9, 11):
                small_out = net.features[:end](x)
                torch.testing.assert_close(
                    small_out, big.features[:end](x)[:, : small_out.shape[1]], atol=1e-5, rtol=1e-4
                )


def test_flancs_decomposition_starts_balanced() -> None:
    """At the start every recovered weight has PyTorch's default std, as in Pa3dFL's scheme."""
    alg = _alg((1.0, 1.0), decomposition="flanc")
    with torch.no_grad():
        full = alg.hn(0, alg.plans(1.0), 128)
        for q in alg.plans(1.0):
            w = recover(q, alg.U[f"{q.key}.U"], full[f"{q.key}.V"])
            assert float(w.std()) == pytest.approx(1 / (3 * q.S * q.k * q.k) ** 0.5, rel=1e-4)


@pytest.mark.parametrize("hn_step", ["plain", "balanced"])
def test_the_server_step_follows_eqs_7_and_8(hn_step: str) -> None:
    # Prepare: three clients of widths 1, 1/2, 1; two take part with returned tensors
    alg = _alg((1.0, 0.25, 1.0), hn_lr=0.3, hn_step=hn_step)
    gen = torch.Generator().manual_seed(1)
    before = {k: v.detach().clone() for k, v in alg.hn.named_parameters()}
    returned, u_up = {}, {}
    for cid in (0, 1):
        sent = alg.broadcast(1, cid)
        returned[cid] = {
            k: v + 0.05 * torch.randn(v.shape, generator=gen)
            for k, v in sent.items()
            if not k.endswith(".U")
        }
        u_up[cid] = {
            k: v + torch.randn(v.shape, generator=gen) for k, v in sent.items() if k.endswith(".U")
        }
    # the expected step: -hn_lr x autograd's gradient of L_HN (the returned tensors constant),
    # times each parameter's step multiplier (all 1 for the plain step)
    sizes = alg.hn_step_sizes
    if hn_step == "plain":
        assert set(sizes.values()) == {1.0}
    else:
        assert sizes["decoders.0.base"] == 1.0 and 0 < sizes["embeddings"] < 1
    loss = (
        sum(
            0.5 * sum((g - returned[cid][k]).pow(2).sum() for k, g in alg._personal(cid).items())
            for cid in (0, 1)
        )
        / 2
    )
    names = list(before)
    grads = torch.autograd.grad(
        loss, [dict(alg.hn.named_parameters())[k] for k in names], allow_unused=True
    )
    expected = {
        k: before[k] - 0.3 * sizes[k] * (g if g is not None else 0)
        for k, g in zip(names, grads, strict=True)
    }
    alg.hn.zero_grad(set_to_none=True)
    # Execute
    alg.begin_round(1, [0, 1])
    for cid, n in ((0, 10), (1, 90)):
        alg.accumulate(ClientResult(cid, n, u_up[cid] | returned[cid]))
    alg.end_round(1)
    # Assert: the hypernetwork and every embedding took exactly that step
    after = dict(alg.hn.named_parameters())
    assert not torch.equal(after["embeddings"][2], before["embeddings"][2])  # via E' attention
    for k in names:
        torch.testing.assert_close(after[k].detach(), expected[k], atol=1e-6, rtol=1e-5)
    # Eq. 6: U is the plain mean over the round's clients (not weighted by their 10 / 90 records)
    for k in u_up[0]:
        torch.testing.assert_close(alg.U[k], (u_up[0][k] + u_up[1][k]) / 2)


def _distance_after_rounds(hn_step: str, rounds: int) -> tuple[float, float]:
    """A client that returns the same target every round: ``||generated - target||`` before and
    after ``rounds`` server steps at Table 7's Hetero HN (hn_lr 1.0, [64, 64, 4])."""
    alg = _alg(
        (1.0, 0.5),
        hn_lr=1.0,
        embed_dim=64,
        hidden_dim=64,
        encoder_depth=4,
        hn_step=hn_step,
        power_iterations=20,  # the default: the step sizes are what this test judges
    )
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        start = {k: v.detach().clone() for k, v in alg._personal(0).items()}
    target = {k: v + 0.1 * v.std() * torch.randn(v.shape, generator=gen) for k, v in start.items()}

    def distance() -> float:
        with torch.no_grad():
            now = alg._personal(0)
            return float(sum((now[k] - target[k]).pow(2).sum() for k in target) ** 0.5)

    first = distance()
    for r in range(rounds):
        alg.begin_round(r + 1, [0])
        alg.accumulate(ClientResult(0, 10, dict(alg.U) | target))
        alg.end_round(r + 1)
    return first, distance()


def test_the_balanced_server_step_converges_where_the_plain_one_diverges() -> None:
    # Table 7's FMNIST Hetero HN step, hn_lr 1.0: plain SGD on the HN moves the generated
    # tensors ~13x the returned delta along its top direction and overshoots; the balanced step
    # (per-group step sizes) moves them by about the delta and reaches the target
    first, plain = _distance_after_rounds("plain", 3)
    _, balanced = _distance_after_rounds("balanced", 3)
    assert not plain < 10 * first  # farther than it started (or NaN)
    assert balanced < 0.05 * first


def test_fewer_power_iterations_estimate_each_top_eigenvalue_lower() -> None:
    # power iteration's Rayleigh quotient only grows toward J J^T's top eigenvalue (J J^T is
    # symmetric PSD): with fewer steps each group's lambda is lower, its step size (share /
    # lambda) no smaller; the knob reaches every group
    few = _alg((1.0, 0.5), power_iterations=1).hn_step_sizes
    many = _alg((1.0, 0.5), power_iterations=20).hn_step_sizes
    assert few.keys() == many.keys()
    assert all(many[k] <= few[k] * (1 + 1e-6) for k in few)
    changed = {k.rsplit(".", 1)[0] for k in few if many[k] < few[k] * (1 - 1e-3)}
    assert {"decoders.0", "head_decoder", "encoder.0"} <= changed, changed


def test_the_power_iteration_leaves_no_torch_internal_warning() -> None:
    # a fresh process's first jvp makes torch script its forward-mode decompositions, and
    # torch.jit.script warns of its own deprecation: a user of pa3dfl has nothing to act on
    code = (
        "import torch\n"
        "from flcore.algorithms.widths.pa3dfl import top_eigenvalue\n"
        "w = torch.randn(3, 4)\n"
        "lam = top_eigenvalue(lambda x: (torch.tanh(x @ w),), (torch.randn(2, 3),),\n"
        "                     torch.Generator().manual_seed(0), iters=3)\n"
        "assert lam > 0\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error::FutureWarning", "-c", code],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[3],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


class _Rec(Callback):
    def __init__(self) -> None:
        self.rounds: list[dict] = []

    def on_round_end(self, result) -> None:  # type: ignore[no-untyped-def]
        self.rounds.append(result.metrics)


@pytest.mark.parametrize(
    "decomposition", ["channel", pytest.param("flanc", marks=pytest.mark.slow)]
)
def test_three_rounds_on_real_fmnist_improve_accuracy(data_root: Path, decomposition: str) -> None:
    raw = {
        "algorithm": "pa3dfl",
        "dataset": "fmnist",
        "data_root": str(data_root),
        "num_clients": 4,
        "samples_per_client": 100,
        "test_samples_per_client": 50,
        "rounds": 3,
        "local_epochs": 3,
        "batch_size": 10,
        "lr": 0.02,
        "eval_every": 1,
        "seed": 3,
        "workers": 1,
        "model": "pa3dfl_cnn_fmnist",
        "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 0.0625, 1.0]},
        "client_split": {"train": 0.6, "val": 0.2, "test": 0.2},
        # Table 7's Hetero hn_lr; small dims and a 3-point alpha grid keep it fast
        "algorithm_params": {
            "embed_dim": 16,
            "hidden_dim": 16,
            "encoder_depth": 2,
            "hn_lr": 1.0,
            "n_alpha": 3,
            "decomposition": decomposition,
        },
    }
    rec = _Rec()
    build_engine(validate_config(raw), callbacks=[rec]).run()
    first, last = rec.rounds[0], rec.rounds[-1]
    # the received model starts at chance (a fixed random global head) and learns; so do the
    # selected models and the training loss (measured: 0.025 -> 0.225, 0.375 -> 0.51, 4.5 -> 4.1)
    assert first["accuracy_before"] < 0.15
    assert last["accuracy_before"] > first["accuracy_before"] + 0.1
    # FLANC's scheme, measured: accuracy 0.50, 0.525, 0.4375 over the three rounds (80 test
    # records: noise), validation 0.41, 0.46, 0.51
    if decomposition == "channel":
        assert last["accuracy"] > first["accuracy"] + 0.05
    assert last["val_accuracy"] > first["val_accuracy"] + 0.05
    assert rec.rounds[0]["train_loss"] > rec.rounds[1]["train_loss"] > last["train_loss"]
    for w in ("1", "0.5", "0.25"):
        assert last[f"accuracy_width_{w}"] is not None
    # Algorithm 1's alpha is logged: the round's clients' mean of grid points {0, 1/2, 1}
    for r in rec.rounds:
        twice = 2 * r["selected_alpha"] * r["clients"]
        assert 0 <= r["selected_alpha"] <= 1 and twice == pytest.approx(round(twice))


def test_model_selection_picks_the_best_validation_alpha(fmnist) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a briefly trained plain width-1/2 model M*; M0 = M* + D and M1 = M* - D, so the
    # grid's midpoint is M* and both ends are M* heavily perturbed
    torch.manual_seed(0)
    model = SPEC(width=0.5)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    x, y = normalize(fmnist.train.images[:400], fmnist.info), fmnist.train.labels[:400]
    for idx in torch.arange(800).remainder(400).split(50):  # two epochs
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    star = {k: v.detach().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(3)
    d = {k: 3 * v.std() * torch.randn(v.shape, generator=gen) for k, v in star.items()}
    m0 = {k: star[k] + d[k] for k in star}
    m1 = {k: star[k] - d[k] for k in star}
    val = ArrayDataset(fmnist.test.images[:200], fmnist.test.labels[:200])
    alg = _alg((0.25,), n_alpha=11)  # width 1/2
    # Execute
    alpha = alg.choose_alpha(0.5, m0, m1, val, fmnist.info)
    # Assert: the chosen alpha's validation accuracy is the grid's best (ties: largest alpha)
    scores = []
    for k in range(11):
        model.load_state_dict(interpolate(m0, m1, k / 10))
        scores.append(evaluate(model, val, fmnist.info)[0])
    best = max(scores)
    assert alpha == max(k / 10 for k, s in enumerate(scores) if s == best)
    assert 0.3 <= alpha <= 0.7 and best > scores[0] + 0.1 and best > scores[-1] + 0.1
    # no validation records: the trained model (alpha = 1)
    assert alg.choose_alpha(0.5, m0, m1, None, fmnist.info) == 1.0
    # the search itself on a known curve, peaked at 0.3
    assert select_alpha(lambda a: -abs(a - 0.3), 11) == (pytest.approx(0.3), pytest.approx(0.0))
    # a plateau over 0.2 - 0.6: the largest of the tied alphas by default, or the smallest
    plateau = lambda a: float(0.15 < a < 0.65)  # noqa: E731
    assert select_alpha(plateau, 11) == (pytest.approx(0.6), 1.0)
    assert select_alpha(plateau, 11, "smallest") == (pytest.approx(0.2), 1.0)
    # the param reaches the search: on the real validation curve above, the smallest of the
    # best-scored alphas
    smallest = _alg((0.25,), n_alpha=11, alpha_ties="smallest")
    chosen = smallest.choose_alpha(0.5, m0, m1, val, fmnist.info)
    assert chosen == min(k / 10 for k, s in enumerate(scores) if s == best)


def test_without_hn_aggregation_the_personal_parts_stay_on_the_client(fmnist) -> None:  # type: ignore[no-untyped-def]
    alg = _alg((1.0, 0.25), hn_aggregation=False)
    state = alg.init_client_state(1)
    sent = alg.broadcast(1, 1)
    assert set(sent) == set(alg.U)  # only U travels
    data = ClientData(
        1,
        ArrayDataset(fmnist.train.images[:40], fmnist.train.labels[:40]),
        ArrayDataset(fmnist.test.images[:20], fmnist.test.labels[:20]),
        fmnist.info,
    )
    task = ClientTask(1, 1, sent, state, False, 2)
    result = alg.local_update(data, task, client_generator(2, 1, 1))
    assert set(result.upload) == set(alg.U)
    assert set(result.state) == set(state)
    assert any(not torch.equal(result.state[k], state[k]) for k in state)  # trained locally
    assert result.state["features.7.V"].shape == (8, 32, 32 * 49)  # width 1/2 of fc1's V


def test_max_grad_norm_clips_the_local_steps(data_root: Path) -> None:
    """A tiny clipping norm leaves the client's tensors almost where they started; without it
    they move: the knob reaches the local training loop."""
    from flcore.algorithms.base import ClientData, ClientTask
    from flcore.config import validate_config
    from flcore.executor import client_generator
    from flcore.experiment import build_engine

    moved = {}
    for clip in (None, 1e-8):
        raw = {
            "dataset": "fmnist",
            "data_root": str(data_root),
            "algorithm": "pa3dfl",
            "model": "pa3dfl_cnn_fmnist",
            "num_clients": 2,
            "samples_per_client": 40,
            "partition": {"name": "iid"},
            "rounds": 1,
            "local_epochs": 1,
            "batch_size": 20,
            "lr": 0.05,
            "workers": 1,
            "capacity": {"name": "fixed", "ratios": [1.0, 0.25]},
            "optimizer": {"name": "sgd", "momentum": 0.0, "weight_decay": 0.0},
            "algorithm_params": {
                "embed_dim": 8,
                "hidden_dim": 8,
                "encoder_depth": 2,
                "power_iterations": 2,
            }
            | ({"max_grad_norm": clip} if clip else {}),
        }
        engine = build_engine(validate_config(raw))
        alg, fed = engine.algorithm, engine.data
        alg.begin_round(1, [1])
        task = ClientTask(1, 1, alg.broadcast(1, 1), engine.client_states[1], False, 0)
        data = ClientData(1, fed.client_train(1), fed.client_test(1), fed.info)
        result = alg.local_update(data, task, client_generator(0, 1, 1))
        moved[clip] = max(
            float((result.upload[k] - task.payload[k]).abs().max())
            for k in result.upload
            if k in task.payload
        )
    assert moved[None] > 1e-3
    assert moved[1e-8] < 1e-6


def test_the_normalized_head_step_scales_only_the_local_heads_gradient(fmnist) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a full-width client network from the HN, features blown up by a scaled input
    alg = _alg((1.0,))
    net = alg.build_net(1.0)
    net.load_state_dict(alg.broadcast(1, 0), strict=False)
    x = 30 * normalize(fmnist.train.images[:50], fmnist.info)
    y = fmnist.train.labels[:50]

    def grads(head_lr: float | None) -> tuple[float, dict[str, torch.Tensor]]:
        net.zero_grad()
        loss = two_head_loss(net, x, y, head_lr=head_lr)
        loss.backward()
        return float(loss), {
            k: p.grad.clone() for k, p in net.named_parameters() if p.requires_grad
        }

    # Execute
    plain_loss, plain = grads(None)
    lr = 0.1
    normalized_loss, normalized = grads(lr)
    # Assert: same loss; the local head's gradient times min(1, 1 / (lr (1 + mean ||x'||^2)));
    # every other gradient untouched
    energy = 1 + float(net.features(x).detach().pow(2).sum(1).mean())
    scale = min(1.0, 1 / (lr * energy))
    assert scale < 0.5
    assert normalized_loss == pytest.approx(plain_loss)
    for k in plain:
        want = plain[k] * scale if k.startswith("local_head.") else plain[k]
        torch.testing.assert_close(normalized[k], want, rtol=1e-4, atol=1e-7)


def test_rank_p_min_clients_is_the_narrowest_width_and_refuses_widths_it_does_not_divide() -> None:
    from flcore.errors import ConfigError

    # the width rule's step (1/16) by default, whatever the clients' widths
    assert _alg((1.0, 1.0)).p_min == 1 / 16
    # Algorithm 2 line 2: every client at width 1 (Ideal) gives R1 = T, one V block a layer
    ideal = _alg((1.0, 1.0), rank_p_min="clients")
    assert ideal.p_min == 1.0
    assert all(plan.R1 == plan.T for plan in ideal.plans(1.0))
    # widths 1/2 and 1: p_min 1/2, R1 = T/2
    half = _alg((0.25, 1.0), rank_p_min="clients")
    assert half.p_min == 0.5 and all(2 * plan.R1 == plan.T for plan in half.plans(1.0))
    # widths 1/8 and 3/16: 3/16 is no multiple of 1/8, so Eq. 5 cannot hold
    with pytest.raises(ConfigError, match="rank_p_min") as err:
        _alg(((1 / 8) ** 2, (3 / 16) ** 2), rank_p_min="clients")
    assert err.value.key == "algorithm_params.rank_p_min"


def test_step_scale_max_caps_the_factors_lr() -> None:
    from flcore.algorithms.widths.pa3dfl import step_scale

    # Ideal under Algorithm 2's p_min: one V block a layer (J = 1), so the k = 5 convs' U and V
    # step at 1 / (2 sqrt(1 / 75)) = 4.33 x lr uncapped, the linear layers' at 0.87 x lr
    free = _alg((1.0, 1.0), rank_p_min="clients")
    capped = _alg((1.0, 1.0), rank_p_min="clients", step_scale_max=1.0)
    scales = [step_scale(q) for q in free.plans(1.0)]
    assert scales[0] == pytest.approx(0.5 * math.sqrt(75))
    assert min(scales) < 1 < max(scales)
    lr = free.training.lr_at(1)
    for alg, want in ((free, scales), (capped, [min(s, 1.0) for s in scales])):
        groups = alg._param_groups(alg._net(1.0), 1)
        assert [g["lr"] for g in groups[:-1]] == pytest.approx([lr * w for w in want])
        assert groups[-1]["lr"] == lr  # biases and the local head
        # the vectorized executor's job carries the same multipliers
        alg.vector_model()  # the executor builds the padded objective first
        alg.begin_round(1, [0])
        task = ClientTask(0, 1, alg.broadcast(1, 0), alg.init_client_state(0), False, 2)
        job = dict(alg.vector_job(task).lr_scale)
        uv = [job[f"net.{q.key}.{part}"] for q in alg.plans(1.0) for part in "UV"]
        assert uv == pytest.approx([w for w in want for _ in "UV"])


def test_eq_32_penalises_each_convs_off_diagonal_gram_and_lambda_applies_once(fmnist) -> None:  # type: ignore[no-untyped-def]
    """Eq. 32, ``lambda sum_conv ||S - diag(S)||^2`` with ``S = U^T U``: with every U all ones
    (``n = R1 k^2`` rows, R2 columns) each conv's S is ``n`` everywhere, so its term is
    ``R2 (R2 - 1) n^2`` and the linear layers add nothing; the client's objective adds it once
    times lambda (Algorithm 3 line 11 would multiply by lambda twice)."""
    from flcore.algorithms.widths.decomposed import orthogonality_penalty

    alg = _alg((1.0,), reg_lambda=0.5)
    net = alg.build_net(1.0)
    net.load_state_dict(alg.broadcast(1, 0), strict=False)
    expected = 0.0
    with torch.no_grad():
        for q in alg.plans(1.0):
            net.features[q.index].U.fill_(1.0)
            if q.kind == "conv":
                n = net.features[q.index].U.numel() // q.R2
                expected += q.R2 * (q.R2 - 1) * n**2
    assert {q.kind for q in alg.plans(1.0)} == {"conv", "linear"}
    assert float(orthogonality_penalty(net)) == pytest.approx(expected, rel=1e-6)
    x = normalize(fmnist.train.images[:20], fmnist.info)
    y = fmnist.train.labels[:20]
    without = _alg((1.0,), reg_lambda=0.0)
    with torch.no_grad():
        added = alg._objective(net, x, y) - without._objective(net, x, y)
    assert float(added) == pytest.approx(0.5 * expected, rel=1e-5)


def _trained_keys(net: object) -> list[str]:
    return [*net.general_keys(), *net.personal_keys()]  # type: ignore[attr-defined]


@pytest.mark.parametrize("decomposition", ["channel", "flanc"])
def test_width_draw_upto_trains_the_narrower_network_inside_the_clients(
    fmnist,  # type: ignore[no-untyped-def]
    decomposition: str,
) -> None:
    """A step at width q < p_i is the width-q network's: its loss and, on the width-q
    network's entries, its gradients; every other entry gets a zero gradient."""
    alg = _alg((0.25, 1.0), width_draw="upto", decomposition=decomposition, reg_lambda=0.01)
    alg._round_head_lr = 0.05  # the normalized local-head step of the Table 1 configs
    big = alg.build_net(0.5)
    big.load_state_dict(alg.broadcast(1, 0), strict=False)
    small = alg.build_net(0.1875)
    shapes = {k: v.shape for k, v in small.state_dict().items()}
    start = big.state_dict()
    small.load_state_dict(
        {k: leading_block(start[k], shapes[k]) for k in _trained_keys(small)}, strict=False
    )
    x = normalize(fmnist.train.images[:16], fmnist.info)
    y = fmnist.train.labels[:16]
    loss_big = alg.sub_width_loss(big, 0.5, 0.1875, x, y)
    loss_small = alg.sub_width_loss(small, 0.1875, 0.1875, x, y)  # the plain objective
    torch.testing.assert_close(loss_big, loss_small)
    loss_big.backward()
    loss_small.backward()
    params_big, params_small = dict(big.named_parameters()), dict(small.named_parameters())
    masks = alg.width_masks(0.5, 0.1875)
    # every U and the local head's bias (one per class) are the same at both widths
    same = {k for k in _trained_keys(big) if k.endswith(".U")} | {"local_head.bias"}
    assert set(masks) == set(_trained_keys(big)) - same
    for k in _trained_keys(big):
        g_big, g_small = params_big[k].grad, params_small[k].grad
        assert g_big is not None and g_small is not None
        torch.testing.assert_close(leading_block(g_big, g_small.shape), g_small)
        outside = padded(torch.ones_like(g_small), g_big.shape, k) == 0
        assert g_big[outside].abs().max() == 0 if outside.any() else True
        assert g_small.abs().max() > 0


def test_width_draw_upto_draws_a_width_per_step_up_to_the_clients(fmnist, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    alg = _alg((1 / 16, 1 / 256, 1.0), width_draw="upto")  # widths 1/4, 1/16, 1
    assert alg.drawn_widths(0) == [0.0625, 0.125, 0.1875, 0.25]
    assert alg.drawn_widths(1) == [0.0625]
    drawn: list[tuple[float, float]] = []
    real = alg.sub_width_loss

    def record(net, width, sub, x, y):  # type: ignore[no-untyped-def]
        drawn.append((width, sub))
        return real(net, width, sub, x, y)

    monkeypatch.setattr(alg, "sub_width_loss", record)
    data = ClientData(
        0,
        ArrayDataset(fmnist.train.images[:200], fmnist.train.labels[:200]),
        ArrayDataset(fmnist.test.images[:20], fmnist.test.labels[:20]),
        fmnist.info,
    )
    alg.local_update(
        data, ClientTask(0, 1, alg.broadcast(1, 0), None, False, 2), client_generator(2, 1, 0)
    )
    assert len(drawn) == 10  # one draw a step: 200 records in batches of 20, one epoch
    assert {w for w, _ in drawn} == {0.25}
    assert {s for _, s in drawn} <= set(alg.drawn_widths(0)) and len({s for _, s in drawn}) > 1
    # a client with one width trains as under width_draw 'own', bit for bit
    own = _alg((1 / 16, 1 / 256, 1.0))
    task = ClientTask(1, 1, own.broadcast(1, 1), None, False, 2)
    a = own.local_update(data, task, client_generator(2, 1, 1))
    b = alg.local_update(data, task, client_generator(2, 1, 1))
    for k in a.upload:
        assert torch.equal(a.upload[k], b.upload[k]), k


def test_width_draw_upto_runs_on_the_loop_only() -> None:
    alg = _alg((0.25, 1.0), width_draw="upto")
    with pytest.raises(ConfigError, match="width_draw 'upto'"):
        resolve_executor("vectorized", alg, "cpu")
    assert resolve_executor("auto", alg, "cuda") == "loop"
    assert _alg((0.25, 1.0)).vector_unsupported() is None
