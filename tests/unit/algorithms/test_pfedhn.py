"""pFedHN and pFedHN-PC on real FMNIST: what is sent, what comes back, and the server step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flcore.algorithms import ClientData, ClientTask
from flcore.config import validate_config
from flcore.executor import client_generator
from flcore.experiment import build_engine


def _cfg(data_root: Path, algorithm: str, **over):  # type: ignore[no-untyped-def]
    raw = {
        "algorithm": algorithm,
        "data_root": str(data_root),
        "num_clients": 4,
        "global_test_per_class": 50,
        "samples_per_client": 100,
        "test_samples_per_client": 50,
        "rounds": 2,
        "local_epochs": 1,
        "batch_size": 25,
        "lr": 0.05,
        "workers": 1,
        "seed": 6,
    } | over
    return validate_config(raw)


def _client(engine, cid: int = 1):  # type: ignore[no-untyped-def]
    alg, data = engine.algorithm, engine.data
    alg.begin_round(1, [cid])
    task = ClientTask(cid, 1, alg.broadcast(1, cid), engine.client_states[cid], True, 6)
    cdata = ClientData(cid, data.client_train(cid), data.client_test(cid), data.info)
    return task, alg.local_update(cdata, task, client_generator(6, 1, cid))


@pytest.mark.parametrize("algorithm", ["pfedhn", "pfedhn_pc"])
def test_generated_model_goes_down_and_its_delta_comes_back(
    data_root: Path, algorithm: str
) -> None:
    engine = build_engine(_cfg(data_root, algorithm))
    alg = engine.algorithm
    task, result = _client(engine)
    model_keys = set(alg.model_spec().state_dict())
    if algorithm == "pfedhn":
        assert set(task.payload) == model_keys  # the whole model is generated
        assert result.state is None
    else:
        assert set(task.payload) == {k for k in model_keys if k.startswith("features.")}
        assert set(result.state) == {"head.weight", "head.bias"}  # the head stays
        assert not torch.equal(result.state["head.weight"], task.state["head.weight"])
    assert set(result.upload) == set(task.payload)  # a delta of exactly what was sent
    assert sum(float(d.abs().sum()) for d in result.upload.values()) > 0
    # embedding dimension of the paper's code: 1 + N / 4
    assert alg.embeddings.shape == (4, 2)


def test_a_server_step_moves_the_generated_model_toward_the_trained_one(
    data_root: Path,
) -> None:
    cfg = _cfg(
        data_root,
        "pfedhn",
        algorithm_params={"server_lr": 1e-3, "server_momentum": 0.0, "server_weight_decay": 0},
    )
    engine = build_engine(cfg)
    alg = engine.algorithm
    task, result = _client(engine)
    trained = {k: task.payload[k] + result.upload[k] for k in task.payload}

    def gap() -> float:
        now = alg.broadcast(1, 1)
        return sum(float((now[k] - trained[k]).pow(2).sum()) for k in trained)

    other = alg.embeddings[0].detach().clone()
    before = gap()
    alg.accumulate(result)
    alg.end_round(1)
    assert gap() < before
    assert torch.equal(alg.embeddings[0].detach(), other)  # only client 1's embedding moved


def test_end_round_without_clients_is_an_error(data_root: Path) -> None:
    engine = build_engine(_cfg(data_root, "pfedhn"))
    engine.algorithm.begin_round(1, [])
    with pytest.raises(ValueError, match="no client"):
        engine.algorithm.end_round(1)


def test_a_round_is_one_server_step_on_the_weighted_mean_chain_rule_gradient(
    data_root: Path,
) -> None:
    """server_steps round: phi takes one SGD step on sum_i n_i J_i^T (start_i - trained_i) /
    sum_i n_i; each embedding takes its own client's full gradient."""
    params = {
        "server_lr": 0.05,
        "server_momentum": 0.0,
        "server_weight_decay": 0.0,
        "max_grad_norm": None,
    }
    engine = build_engine(_cfg(data_root, "pfedhn", algorithm_params=params))
    alg, data = engine.algorithm, engine.data
    ids = [0, 2]
    alg.begin_round(1, ids)
    results = []
    for cid in ids:
        task = ClientTask(cid, 1, alg.broadcast(1, cid), engine.client_states[cid], False, 6)
        cdata = ClientData(cid, data.client_train(cid), data.client_test(cid), data.info)
        results.append(alg.local_update(cdata, task, client_generator(6, 1, cid)))
    phi0 = [p.detach().clone() for p in alg.hnet.parameters()]
    emb0 = alg.embeddings.detach().clone()
    # the expected step, by hand
    grads_phi = [torch.zeros_like(p) for p in phi0]
    grads_emb = torch.zeros_like(emb0)
    total = float(sum(r.num_samples for r in results))
    for r in results:
        gen = alg._generate(r.client_id)
        names = list(gen)
        g = torch.autograd.grad(
            [gen[k] for k in names],
            [*alg.hnet.parameters(), alg.embeddings],
            grad_outputs=[-r.upload[k] for k in names],
        )
        for acc, gi in zip(grads_phi, g[:-1], strict=True):
            acc += gi * r.num_samples / total
        grads_emb += g[-1]
    for r in results:
        alg.accumulate(r)
    alg.end_round(1)
    for p, p0, g in zip(alg.hnet.parameters(), phi0, grads_phi, strict=True):
        torch.testing.assert_close(p.detach(), p0 - 0.05 * g, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(alg.embeddings.detach(), emb0 - 0.05 * grads_emb)
    assert torch.equal(alg.embeddings[1].detach(), emb0[1])  # not sampled: unmoved


def test_three_rounds_under_capacity_train_the_narrowest_width_and_the_server_learns(
    data_root: Path,
) -> None:
    """Pa3dFL's Table 1 runs pFedHN capacity-unaware: every client trains the narrowest width
    all can compute (r = 1/16: width 1/4 of the FMNIST CNN). Over three rounds the generated
    models themselves improve (``accuracy_before`` of round 3 against round 1: the hypernetwork
    learned, not only each round's local training; measured 0.135, 0.24, 0.32)."""
    from tests.unit.algorithms.test_flanc import run_rounds

    cfg = _cfg(
        data_root,
        "pfedhn",
        model="pa3dfl_cnn_fmnist",
        capacity={"name": "fixed", "ratios": [1.0, 0.25, 0.25, 0.0625]},
        local_epochs=2,
        algorithm_params={"embed_dim": 5, "hidden_dim": 100, "depth": 2},
    )
    engine = build_engine(cfg)
    widths = {v.shape for k, v in engine.algorithm.broadcast(1, 0).items() if k.endswith("weight")}
    assert (8, 1, 5, 5) in widths and (16, 8, 5, 5) in widths  # conv 32 and 64 at width 1/4
    rounds = run_rounds(engine, 3)
    assert rounds[0]["accuracy_before"] < 0.3
    assert rounds[2]["accuracy_before"] > rounds[0]["accuracy_before"] + 0.1, rounds
