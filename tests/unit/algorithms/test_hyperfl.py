"""HyperFL on real FMNIST: generated shapes, what leaves the client, learning, embeddings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flcore.algorithms import ALGORITHMS, ClientData, ClientTask
from flcore.algorithms.training import evaluate
from flcore.config import validate_config
from flcore.errors import ConfigError
from flcore.executor import client_generator
from flcore.experiment import build_data, build_engine
from flcore.models import build_model
from flcore.models.hypernet import HyperNetwork


@pytest.mark.parametrize(("model", "channels"), [("cnn_fmnist", 1), ("cnn_cifar", 3)])
def test_generated_weights_have_exactly_the_extractor_shapes(model: str, channels: int) -> None:
    net = build_model(model, num_classes=10, in_channels=channels)
    hnet = HyperNetwork.for_module(net.features, embed_dim=8, hidden_dim=16, depth=2)
    out = hnet(torch.randn(8))
    want = {k: p.shape for k, p in net.features.named_parameters()}
    assert {k: v.shape for k, v in out.items()} == want
    x = torch.randn(2, channels, *((28, 28) if channels == 1 else (32, 32)))
    logits = net.head(torch.func.functional_call(net.features, out, (x,)))
    assert logits.shape == (2, 10)


def test_the_paper_hypernetwork_has_about_15m_parameters() -> None:
    net = build_model("cnn_fmnist", num_classes=10, in_channels=1)
    hnet = HyperNetwork.for_module(net.features)  # embedding 64, hidden 128, one layer
    assert 14.5e6 < sum(p.numel() for p in hnet.parameters()) < 15.5e6


def _cfg(data_root: Path, **over):  # type: ignore[no-untyped-def]
    raw = {
        "algorithm": "hyperfl",
        "data_root": str(data_root),
        "num_clients": 3,
        "global_test_per_class": 50,
        "samples_per_client": 150,
        "test_samples_per_client": 100,
        "rounds": 3,
        "local_epochs": 1,
        "batch_size": 50,
        "lr": 0.01,
        "workers": 1,
        "seed": 4,
        "eval_every": 1,
        "algorithm_params": {"embed_dim": 16, "hidden_dim": 32},
    } | over
    return validate_config(raw)


def _first_update(engine, cfg, *, evaluate: bool):  # type: ignore[no-untyped-def]
    """Client 0's round-1 local update, outside the engine: (its task, its result)."""
    alg, data = engine.algorithm, engine.data
    alg.begin_round(1, [0])
    task = ClientTask(0, 1, alg.broadcast(1, 0), engine.client_states[0], evaluate, cfg.seed)
    cdata = ClientData(0, data.client_train(0), data.client_test(0), data.info)
    return task, alg.local_update(cdata, task, client_generator(cfg.seed, 1, 0))


def test_only_hypernetwork_tensors_leave_the_client(data_root: Path) -> None:
    cfg = _cfg(data_root)
    engine = build_engine(cfg)
    task, result = _first_update(engine, cfg, evaluate=True)
    hnet_state = engine.algorithm.hnet.state_dict()
    assert set(result.upload) == set(hnet_state)
    assert {k: v.shape for k, v in result.upload.items()} == {
        k: v.shape for k, v in hnet_state.items()
    }
    # the embedding and the classifier stay with the client, and changed there
    assert set(result.state) == {"embedding", "head.weight", "head.bias"}
    assert not torch.equal(result.state["embedding"], task.state["embedding"])
    assert not torch.equal(result.state["head.weight"], task.state["head.weight"])
    private = [result.state["embedding"], result.state["head.weight"], result.state["head.bias"]]
    for t in result.upload.values():
        for secret in private:
            assert t.shape != secret.shape or not torch.equal(t, secret)
    assert any(not torch.equal(result.upload[k], hnet_state[k]) for k in hnet_state)


def test_three_rounds_improve_on_round_zero_and_embeddings_are_kept(data_root: Path) -> None:
    cfg = _cfg(data_root)
    data = build_data(cfg)
    engine = build_engine(cfg, data=data)
    alg = engine.algorithm
    # round 0: every client's initial personalized model (generated extractor + initial head)
    net = alg.model_spec()
    with torch.no_grad():
        for k, w in alg.hnet(alg._embedding0).items():
            net.features.get_parameter(k).copy_(w)
    net.head.load_state_dict({k.removeprefix("head."): v for k, v in alg._head0.items()})
    before = sum(evaluate(net, data.client_test(c), data.info)[0] for c in range(3)) / 3
    results = list(engine.iter_rounds())
    assert results[-1].metrics["accuracy"] > before + 0.2
    assert results[-1].metrics["global_accuracy"] is None
    emb = alg.client_embeddings(engine.client_states)
    assert emb.shape == (3, 16)
    assert len({tuple(r) for r in emb.round(6).tolist()}) == 3  # they start equal, end apart


def test_params_are_validated(data_root: Path) -> None:
    with pytest.raises(ConfigError, match="algorithm_params.depth"):
        _cfg(data_root, algorithm_params={"depth": 0})
    with pytest.raises(ConfigError, match="algorithm_params.hidden"):
        _cfg(data_root, algorithm_params={"hidden": 3})


def test_clients_keep_no_copy_of_the_hypernetwork_between_rounds(data_root: Path) -> None:
    """What the engine keeps per client is the embedding and the head: small, whatever the
    hypernetwork's size (the server's mean is a stream, not N copies)."""
    cfg = _cfg(data_root, rounds=1, algorithm_params={})  # the paper's 15M-parameter generator
    engine = build_engine(cfg)
    engine.run()
    hnet = sum(p.numel() for p in engine.algorithm.hnet.parameters())
    for state in engine.client_states.values():
        kept = sum(t.numel() for t in state.values())
        assert kept < 2000 < hnet / 1000


def test_step_two_clips_the_hypernetwork_and_the_embedding_apart(data_root: Path) -> None:
    """As the authors' code: each part's gradient is clipped to max_grad_norm on its own (a
    joint clip would leave each part below it). One plain SGD step (no weight decay, no head
    step), so each part moves by exactly lr x its clipped gradient."""
    clip, lr = 2e-5, 1.0  # both gradients are larger than clip (embedding: ~9e-5)
    cfg = _cfg(
        data_root,
        samples_per_client=50,
        lr=lr,
        optimizer={"name": "sgd", "momentum": 0.5, "weight_decay": 0.0},
        algorithm_params={
            "embed_dim": 16,
            "hidden_dim": 32,
            "head_epochs": 0,
            "max_grad_norm": clip,
        },
    )
    task, result = _first_update(build_engine(cfg), cfg, evaluate=False)
    moved_h = sum(
        float((result.upload[k] - v).double().pow(2).sum()) for k, v in task.payload.items()
    )
    moved_e = float((result.state["embedding"] - task.state["embedding"]).double().norm())
    assert moved_h**0.5 == pytest.approx(lr * clip, rel=1e-2)
    assert moved_e == pytest.approx(lr * clip, rel=1e-2)


def test_head_init_scale_scales_only_the_heads() -> None:
    net = build_model("cnn_fmnist", num_classes=10, in_channels=1)
    torch.manual_seed(0)
    authors = HyperNetwork.for_module(net.features)
    torch.manual_seed(0)
    scaled = HyperNetwork.for_module(net.features, head_init_scale=0.1)
    for (k, a), (_, b) in zip(
        authors.state_dict().items(), scaled.state_dict().items(), strict=True
    ):
        want = a * 0.1 if k.startswith("heads.") else a
        assert torch.allclose(b, want), k
    # the authors' default init generates an extractor far larger than a CNN's own init (the
    # first loss is in the tens); scaled by 0.1 it is ten times smaller
    v = torch.randn(64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        std_a = torch.cat([t.flatten() for t in authors(v).values()]).std()
        std_s = torch.cat([t.flatten() for t in scaled(v).values()]).std()
    assert float(std_a) > 0.1
    assert float(std_s) == pytest.approx(float(std_a) * 0.1, rel=1e-4)
    with pytest.raises(ValueError, match="head_init_scale"):
        HyperNetwork.for_module(net.features, head_init_scale=0.0)


def test_the_default_heads_start_at_a_tenth_of_the_authors_init(data_root: Path) -> None:
    # the default (0.1) reaches the hypernetwork the server builds; head_init_scale=1 is the
    # authors' code; hyperfl_lpm keeps the authors' init (its adapters were not measured)
    ours = build_engine(_cfg(data_root)).algorithm.hnet.state_dict()
    cfg = _cfg(
        data_root, algorithm_params={"embed_dim": 16, "hidden_dim": 32, "head_init_scale": 1}
    )
    authors = build_engine(cfg).algorithm.hnet.state_dict()
    for k, a in authors.items():
        assert torch.allclose(ours[k], a * 0.1 if k.startswith("heads.") else a), k
    assert ALGORITHMS.get("hyperfl_lpm").Params().head_init_scale == 1.0
