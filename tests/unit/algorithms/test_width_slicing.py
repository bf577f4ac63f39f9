"""HeteroFL, FjORD and FedRolex on real FMNIST: what each client receives, covering aggregation
against hand-computed examples, FedRolex's rolling window, and learning over rounds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import flcore.algorithms.widths.fedrolex  # noqa: F401  (registers)
import flcore.algorithms.widths.fjord  # noqa: F401  (registers)
import flcore.algorithms.widths.heterofl  # noqa: F401  (registers)
from flcore.algorithms import ClientData, ClientResult, ClientTask
from flcore.algorithms.cover import CoverMean
from flcore.algorithms.training import evaluate
from flcore.algorithms.widths.heterofl import scaler
from flcore.algorithms.widths.slicing import rolling_channels, submodel_index
from flcore.config import validate_config
from flcore.data import ArrayDataset, normalize
from flcore.errors import ConfigError
from flcore.executor import client_generator
from flcore.experiment import build_data, build_engine

ALGS = ["heterofl", "fjord", "fedrolex"]


def _cfg(data_root: Path, algorithm: str, ratios: list[float], **over):  # type: ignore[no-untyped-def]
    raw = {
        "algorithm": algorithm,
        "dataset": "fmnist",
        "data_root": str(data_root),
        "model": "pa3dfl_cnn_fmnist",
        "capacity": {"name": "fixed", "ratios": ratios},
        "client_split": {"train": 0.6, "val": 0.2, "test": 0.2},
        "num_clients": len(ratios),
        "global_test_per_class": 50,
        "samples_per_client": 100,
        "rounds": 3,
        "local_epochs": 1,
        "batch_size": 20,
        "lr": 0.05,
        "eval_every": 100,
        "workers": 1,
        "seed": 3,
    } | over
    return validate_config(raw)


def _nested(full: dict[str, torch.Tensor], p: float) -> dict[str, torch.Tensor]:
    """The width-p nested slice of the FMNIST CNN, written out layer by layer."""
    c1, c2, h1, h2 = int(32 * p), int(64 * p), int(512 * p), int(128 * p)
    return {
        "features.0.weight": full["features.0.weight"][:c1],
        "features.0.bias": full["features.0.bias"][:c1],
        "features.3.weight": full["features.3.weight"][:c2, :c1],
        "features.3.bias": full["features.3.bias"][:c2],
        "features.7.weight": full["features.7.weight"][:h1, : c2 * 49],
        "features.7.bias": full["features.7.bias"][:h1],
        "features.9.weight": full["features.9.weight"][:h2, :h1],
        "features.9.bias": full["features.9.bias"][:h2],
        "head.weight": full["head.weight"][:, :h2],
        "head.bias": full["head.bias"],
    }


@pytest.mark.parametrize("algorithm", ALGS)
def test_each_client_receives_exactly_its_width_submodel(data_root: Path, algorithm: str) -> None:
    cfg = _cfg(
        data_root, algorithm, [1.0, 0.25, 0.0625], client_fraction=1.0, rounds=2, eval_every=2
    )
    engine = build_engine(cfg)
    alg = engine.algorithm
    full = {k: v.clone() for k, v in alg.model.state_dict().items()}
    expected_bytes = 0
    for cid, p in enumerate([1.0, 0.5, 0.25]):
        payload = alg.broadcast(1, cid)  # round 1: FedRolex's window starts at 0, so nested too
        reference = alg.model_spec(width=p).state_dict()
        assert {k: v.shape for k, v in payload.items()} == {
            k: v.shape for k, v in reference.items()
        }
        for k, v in _nested(full, p).items():
            assert torch.equal(payload[k], v), (cid, k)
        expected_bytes += 4 * sum(v.numel() for v in reference.values())
    rounds = engine.iter_rounds()
    first = next(rounds)
    rounds.close()
    assert first.metrics["round_bytes_down"] == expected_bytes
    assert first.metrics["round_bytes_up"] == expected_bytes  # the trained submodels come back


def test_cover_mean_against_a_hand_computed_example() -> None:
    # layer L: 4 channels; layer M: 2 channels reading L as blocks of 2 inputs
    axes = {"a": ((0, "L", 1),), "b": ((0, "M", 1), (1, "L", 2))}
    server = {"a": torch.full((4, 1), 9.0), "b": torch.full((2, 8), 9.0)}
    wide = {"L": torch.arange(4), "M": torch.arange(2)}
    half = {"L": torch.tensor([0, 1]), "M": torch.tensor([0])}
    up_wide = {"a": torch.tensor([[1.0], [2.0], [3.0], [4.0]]), "b": torch.full((2, 8), 10.0)}
    up_half = {"a": torch.tensor([[5.0], [6.0]]), "b": torch.full((1, 4), 20.0)}

    wide_at, half_at = submodel_index(server, axes, wide), submodel_index(server, axes, half)

    plain = CoverMean(server)
    plain.add(up_wide, wide_at)
    plain.add(up_half, half_at)
    out = plain.result()
    assert torch.equal(out["a"], torch.tensor([[3.0], [4.0], [3.0], [4.0]]))
    b = torch.full((2, 8), 10.0)
    b[0, :4] = 15.0  # row 0 = M channel 0; columns 0..3 = L channels 0, 1 (blocks of 2)
    assert torch.equal(out["b"], b)

    weighted = CoverMean(server)
    weighted.add(up_wide, wide_at, weight=1.0)
    weighted.add(up_half, half_at, weight=3.0)
    out = weighted.result()
    assert torch.equal(out["a"], torch.tensor([[4.0], [5.0], [3.0], [4.0]]))  # (1+15)/4, (2+18)/4
    assert torch.equal(out["b"][0, :4], torch.full((4,), 17.5))  # (10 + 60) / 4

    alone = CoverMean(server)  # an entry no client holds keeps its value
    alone.add(up_half, half_at)
    out = alone.result()
    assert torch.equal(out["a"], torch.tensor([[5.0], [6.0], [9.0], [9.0]]))
    assert torch.equal(out["b"][0], torch.tensor([20.0] * 4 + [9.0] * 4))
    assert torch.equal(out["b"][1], torch.full((8,), 9.0))


def _aggregate_constants(alg, round: int, n: tuple[int, int]) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    """Client 0 (width 1) uploads all 1s, client 1 (width 1/2) all 4s; the new server model."""
    alg.begin_round(round, [0, 1])
    for cid, value in ((0, 1.0), (1, 4.0)):
        shapes = alg.broadcast(round, cid)
        upload = {k: torch.full_like(v, value) for k, v in shapes.items()}
        alg.accumulate(ClientResult(cid, n[cid], upload))
    alg.end_round(round)
    return alg.model.state_dict()


@pytest.mark.parametrize(
    ("algorithm", "round", "covered", "shared"),
    [
        ("heterofl", 1, range(0, 16), 2.5),  # plain mean of 1 and 4
        ("fjord", 1, range(0, 16), 1.75),  # (30 x 1 + 10 x 4) / 40, sample-weighted
        ("fedrolex", 2, range(1, 17), 2.5),  # round 2: window of 16 of 32 from channel 1
    ],
)
def test_aggregation_over_covering_clients_by_hand(
    data_root: Path, algorithm: str, round: int, covered: range, shared: float
) -> None:
    alg = build_engine(_cfg(data_root, algorithm, [1.0, 0.25])).algorithm
    new = _aggregate_constants(alg, round, (30, 10))
    bias = torch.ones(32)
    bias[list(covered)] = shared
    assert torch.equal(new["features.0.bias"], bias)
    # fc1 reads each conv2 channel as 49 inputs: client 1 holds the 32 x 49 columns of its
    # conv2 channels and 256 of the 512 rows
    start = 1 if algorithm == "fedrolex" else 0  # round 2's window starts at 1 in every layer
    rows = list(range(start, start + 256))
    conv2 = list(range(start, start + 32))
    cols = [c * 49 + j for c in conv2 for j in range(49)]
    fc1 = torch.ones(512, 64 * 49)
    fc1[torch.tensor(rows)[:, None], torch.tensor(cols)[None, :]] = shared
    assert torch.equal(new["features.7.weight"], fc1)
    assert torch.equal(new["head.bias"], torch.full((10,), shared))  # classes never cut


def test_an_entry_no_client_holds_keeps_its_value(data_root: Path) -> None:
    alg = build_engine(_cfg(data_root, "heterofl", [1.0, 0.25])).algorithm
    before = alg.model.state_dict()["features.0.bias"].clone()
    alg.begin_round(1, [1])
    payload = alg.broadcast(1, 1)
    alg.accumulate(ClientResult(1, 10, {k: torch.full_like(v, 7.0) for k, v in payload.items()}))
    alg.end_round(1)
    after = alg.model.state_dict()["features.0.bias"]
    assert torch.equal(after[:16], torch.full((16,), 7.0))
    assert torch.equal(after[16:], before[16:])


def test_fedrolex_window_moves_with_the_round_and_wraps(data_root: Path) -> None:
    windows = [rolling_channels({"L": 4}, 0.5, r)["L"].tolist() for r in range(1, 6)]
    assert windows == [[0, 1], [1, 2], [2, 3], [0, 3], [0, 1]]
    alg = build_engine(_cfg(data_root, "fedrolex", [1.0, 0.25])).algorithm
    bias = alg.model.state_dict()["features.0.bias"]
    assert torch.equal(alg.broadcast(3, 1)["features.0.bias"], bias[2:18])
    wrapped = torch.tensor([*range(15), 31])  # round 32: channels 31, 0, ..., 14 of conv1
    assert torch.equal(alg.broadcast(32, 1)["features.0.bias"], bias[wrapped])
    conv2 = alg.model.state_dict()["features.3.weight"]  # 64 outputs: 32 from 31; inputs as conv1
    assert torch.equal(alg.broadcast(32, 1)["features.3.weight"], conv2[31:63][:, wrapped])
    assert torch.equal(alg.broadcast(32, 0)["features.3.weight"], conv2)  # full width: all


def _client(engine, cid: int):  # type: ignore[no-untyped-def]
    d = engine.data
    return ClientData(cid, d.client_train(cid), d.client_test(cid), d.info, d.client_val(cid))


def test_heterofl_masks_absent_classes_and_scales_narrow_layers(data_root: Path) -> None:
    cfg = _cfg(data_root, "heterofl", [1.0, 0.25], optimizer={"name": "sgd", "weight_decay": 0.0})
    engine = build_engine(cfg)
    alg = engine.algorithm
    data = _client(engine, 1)
    classes = data.train.labels.unique()[:2].tolist()  # keep the records of two of its classes
    keep = torch.isin(data.train.labels, torch.tensor(classes))
    data = ClientData(
        1, ArrayDataset(data.train.images[keep], data.train.labels[keep]), data.test, data.info
    )
    task = ClientTask(1, 1, alg.broadcast(1, 1), None, False, 3)
    up = alg.local_update(data, task, client_generator(3, 1, 1)).upload
    moved = (up["head.bias"] != task.payload["head.bias"]).tolist()
    assert moved == [c in classes for c in range(10)]  # absent classes: no gradient, no decay
    # the Scaler: while training, the output of a width-1/2 layer with cut inputs is divided by
    # 1/2; the first conv (uncut image channels) and the output layer are not scaled
    model = alg.client_model(0.5)
    x = normalize(data.test.images[:2], data.info)
    h1, flat, feats = model.features[:3](x), model.features[:7](x), model.features(x)
    plain = [model.features[0](x), model.features[3](h1), model.features[7](flat)]
    plain_head = model.head(feats)
    with scaler(model, alg.axes(), 0.5):
        model.train()
        assert torch.equal(model.features[0](x), plain[0])
        assert torch.allclose(model.features[3](h1), plain[1] * 2)
        assert torch.allclose(model.features[7](flat), plain[2] * 2)
        assert torch.equal(model.head(feats), plain_head)
    assert torch.equal(model.features[3](h1), plain[1])  # gone after training


def test_heterofl_without_the_scaler_trains_the_plain_submodel(data_root: Path) -> None:
    """``algorithm_params.scaler: false``: nothing divides a narrow client's outputs, in
    training or on the attack surface; the default (the paper's) keeps the Scaler."""
    on = build_engine(_cfg(data_root, "heterofl", [1.0, 0.25])).algorithm
    off_cfg = _cfg(data_root, "heterofl", [1.0, 0.25], algorithm_params={"scaler": False})
    engine = build_engine(off_cfg)
    off = engine.algorithm
    assert (on.scaler_width(1), off.scaler_width(1), off.scaler_width(0)) == (0.5, 1.0, 1.0)
    data = _client(engine, 1)
    x = normalize(data.test.images[:4], data.info)
    plain = off.client_model(0.5)
    plain.load_state_dict(off.broadcast(1, 1))
    surface = off.surface_model(1)
    surface.load_state_dict(off.broadcast(1, 1))
    assert torch.equal(surface(x), plain(x))  # no Scaler hook on the surface either
    scaled = on.surface_model(1)
    scaled.load_state_dict(on.broadcast(1, 1))
    assert not torch.allclose(scaled(x), plain(x))  # same start (seed 3): the Scaler's factor
    task = ClientTask(1, 1, off.broadcast(1, 1), None, False, 3)
    up_off = off.local_update(data, task, client_generator(3, 1, 1)).upload
    up_on = on.local_update(data, task, client_generator(3, 1, 1)).upload
    assert not torch.allclose(up_off["features.3.weight"], up_on["features.3.weight"])
    with pytest.raises(ConfigError, match="algorithm_params.scaler"):
        build_engine(_cfg(data_root, "heterofl", [1.0], algorithm_params={"scaler": "maybe"}))


def test_fjord_draws_from_the_widths_up_to_its_own_and_validates_params(data_root: Path) -> None:
    alg = build_engine(_cfg(data_root, "fjord", [1.0, 0.0625, 0.25])).algorithm  # 1, 1/4, 1/2
    assert alg.sampled_widths(1) == [0.0625, 0.125, 0.1875, 0.25]
    assert alg.sampled_widths(2) == [k / 16 for k in range(1, 9)]
    assert alg.sampled_widths(0) == [k / 16 for k in range(1, 17)]
    with pytest.raises(ConfigError, match="algorithm_params.distill_alpha"):
        _cfg(data_root, "fjord", [1.0], algorithm_params={"distill_alpha": 1.5})


#: the learning runs: iid records so a uniform test set measures progress; widths on a 1/4 grid
LEARN = {
    "partition": {"name": "iid"},
    "samples_per_client": 300,
    "local_epochs": 2,
    "batch_size": 20,
    "client_fraction": 1.0,
    "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 0.0625, 1.0], "p_min": 0.25},
}


@pytest.fixture(scope="module")
def four_clients(data_root: Path):  # type: ignore[no-untyped-def]
    return build_data(_cfg(data_root, "heterofl", [1.0, 0.25, 0.0625, 1.0], **LEARN))


@pytest.mark.parametrize("algorithm", ALGS)
def test_three_rounds_learn(data_root: Path, four_clients, algorithm: str) -> None:  # type: ignore[no-untyped-def]
    """Round 3 beats round 1: the global model on 1,000 test records (HeteroFL, FedRolex: by
    0.2 or more with seeds 3, 4, 5), and for FjORD the clients' mean accuracy after training
    (its full-width model is trained in 1 of 4 steps and is still erratic after 3 rounds; the
    clients' mean rose by 0.06-0.08 with seeds 3, 4, 5)."""
    cfg = _cfg(data_root, algorithm, [1.0, 0.25, 0.0625, 1.0], **LEARN)
    engine = build_engine(cfg, data=four_clients)
    alg, fed = engine.algorithm, four_clients
    test = fed.global_test_set()
    test = ArrayDataset(test.images[:1000], test.labels[:1000])
    global_acc, client_acc = {}, {}
    for r in (1, 2, 3):
        alg.begin_round(r, [0, 1, 2, 3])
        accs = []
        for cid in range(4):
            evaluate_now = algorithm == "fjord" and r != 2
            task = ClientTask(cid, r, alg.broadcast(r, cid), None, evaluate_now, cfg.seed)
            gen = client_generator(cfg.seed, r, cid)
            result = alg.local_update(_client(engine, cid), task, gen)
            accs.append(result.metrics.get("accuracy", 0.0))
            alg.accumulate(result)
        alg.end_round(r)
        client_acc[r] = sum(accs) / 4
        if algorithm != "fjord" and r != 2:
            global_acc[r] = evaluate(alg.global_model(), test, fed.info)[0]
    if algorithm == "fjord":
        assert client_acc[3] > client_acc[1] + 0.03, client_acc
    else:
        assert global_acc[3] > global_acc[1] + 0.1, global_acc


@pytest.mark.parametrize("model", ["pa3dfl_cnn_fmnist", "pa3dfl_cnn_fmnist_sbn"])
def test_heterofl_scores_a_narrow_submodel_as_it_trained(data_root: Path, model: str) -> None:
    """Without BN a width-1/2 client's submodel is scored with the Scaler on (nothing cancels
    it); with static BN without it (the normalisation cancels it, as in HeteroFL); the
    full-width client never scales."""
    engine = build_engine(_cfg(data_root, "heterofl", [1.0, 0.25], model=model))
    alg = engine.algorithm
    data = _client(engine, 1)
    task = ClientTask(1, 1, alg.broadcast(1, 1), None, True, 3)
    net = alg.client_model(0.5)
    net.load_state_dict(task.payload)
    scored = alg.client_eval(task, net, data)
    got = (scored["accuracy"], scored["test_loss"])
    from flcore.algorithms.training import static_bn

    def acc(width: float) -> tuple[float, float]:
        with scaler(net, alg.axes(), width), static_bn(net, data.train, data.info):
            return evaluate(net, data.test, data.info)

    scaled, plain = acc(0.5), acc(1.0)
    if model.endswith("_sbn"):
        assert got == plain
    else:
        assert got == scaled
        assert scaled[1] != plain[1]  # the premise: the Scaler changes a BN-free submodel
    wide = ClientTask(0, 1, alg.broadcast(1, 0), None, True, 3)
    full = alg.client_model(1.0)
    full.load_state_dict(wide.payload)
    data0 = _client(engine, 0)
    with static_bn(full, data0.train, data0.info):
        want = evaluate(full, data0.test, data0.info)[0]
    assert alg.client_eval(wide, full, data0, before=True)["accuracy_before"] == want


def test_fjords_self_distillation_is_sec_3_3s_loss_with_a_fixed_teacher(data_root: Path) -> None:
    """A step at p < p_max: ``(1 - alpha) CE(y_p, y) + alpha T^2 KL(softmax(y_pmax / T) ||
    softmax(y_p / T))``, the p_max logits a fixed target (no gradient through them); a step at
    p_max: the cross-entropy alone. Written out by hand against the step objective (the loop
    equals it: tests/unit/test_vectorized.py)."""
    params = {"distill_alpha": 0.3, "distill_temperature": 2.0}
    alg = build_engine(_cfg(data_root, "fjord", [1.0], algorithm_params=params)).algorithm
    objective = alg.vector_model()
    fed = build_data(_cfg(data_root, "fjord", [1.0]))
    batch = fed.client_train(0)
    x, y = normalize(batch.images[:20], fed.info), batch.labels[:20]
    mask = torch.ones(20)
    choices = torch.tensor(16)  # p_i = 1: levels 1 .. 16 of p_min 1/16

    def by_hand(level: int) -> torch.Tensor:
        student = objective._logits(torch.tensor(level), x)
        ce = torch.nn.functional.cross_entropy(student, y)
        if level == 16:
            return ce
        with torch.no_grad():
            teacher = objective._logits(choices, x)
        log_pt = torch.log_softmax(teacher / 2.0, dim=1)
        log_ps = torch.log_softmax(student / 2.0, dim=1)
        kl = (log_pt.exp() * (log_pt - log_ps)).sum(1).mean()
        return 0.7 * ce + 0.3 * 4.0 * kl

    for level in (4, 16):
        names = [k for k, p in objective.named_parameters() if p.requires_grad]
        got = objective(x, y, mask, torch.tensor(level - 1), choices)
        got_grads = torch.autograd.grad(got, [dict(objective.named_parameters())[k] for k in names])
        want = by_hand(level)
        want_grads = torch.autograd.grad(
            want, [dict(objective.named_parameters())[k] for k in names]
        )
        assert float(got) == pytest.approx(float(want), rel=1e-5)
        for g, w in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)
    # the distillation term is there at p < p_max: alpha 0 gives another loss
    assert float(objective(x, y, mask, torch.tensor(3), choices)) != pytest.approx(
        float(torch.nn.functional.cross_entropy(objective._logits(torch.tensor(4), x), y))
    )


@pytest.mark.parametrize("algorithm", ["fedrolex", "heterofl"])
def test_at_full_width_the_sliced_methods_are_fedavg(data_root: Path, algorithm: str) -> None:
    """Under ``capacity: ideal`` every FedRolex window and HeteroFL slice is the whole layer
    (HeteroFL's Scaler is 1 there, and its label mask masks nothing when, as here, every client
    holds every class): the same model, batches, steps and (equal-weight) mean as FedAvg, so
    the runs agree to float rounding. (Pa3dFL's Ideal FedRolex config differs from FedAvg's
    only in the algorithm, HeteroFL's also in its lr: BENCHMARKS.md, session 50.)"""
    states, summaries, init = {}, {}, {}
    for name in ("fedavg", algorithm):
        cfg = _cfg(data_root, name, [1.0], capacity={"name": "ideal"}, num_clients=3,
                   samples_per_client=200, rounds=2, eval_every=1,
                   client_fraction=1.0)  # fmt: skip
        engine = build_engine(cfg)
        model = engine.algorithm.global_model()
        if init:  # the same start (each draws its initial weights its own way)
            model.load_state_dict(init)
        init = {k: v.clone() for k, v in model.state_dict().items()}
        if name == "heterofl":
            for cid in range(3):
                labels = engine.data.client_train(cid).labels
                assert set(labels.tolist()) == set(range(10))  # the mask keeps every class
        summaries[name] = engine.run()
        states[name] = engine.algorithm.global_model().state_dict()
    assert states["fedavg"].keys() == states[algorithm].keys()
    for key, value in states["fedavg"].items():
        torch.testing.assert_close(states[algorithm][key], value, rtol=1e-5, atol=1e-6)
    for key in ("accuracy", "accuracy_before", "train_loss"):
        assert summaries["fedavg"][key] is not None
        assert summaries[algorithm][key] == pytest.approx(summaries["fedavg"][key], abs=1e-4)
