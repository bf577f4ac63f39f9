"""The vectorized executor equals the per-client loop (float64, real Fashion-MNIST), chunks
change nothing, and what it cannot run is refused before any round."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from flcore.config import validate_config
from flcore.data.partition import Partition
from flcore.engine import Engine
from flcore.errors import ConfigError
from flcore.experiment import build_data, build_engine

#: unequal client sizes: the last batch of an epoch, and clients that finish early
SIZES = (49, 30, 17, 5)


@pytest.fixture
def float64() -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _config(tiny_config: dict, **extra: Any) -> dict:
    return tiny_config | {
        "num_clients": len(SIZES),
        "samples_per_client": max(SIZES),
        "test_samples_per_client": 40,
        "global_test_per_class": 5,
        "local_epochs": 2,
        "batch_size": 16,
        "partition": {"name": "dirichlet", "beta": 0.5},
        **extra,
    }


def _engine(raw: dict, executor: str, chunk: int | None = None) -> Engine:
    cfg = validate_config(raw | {"executor": executor, "executor_chunk": chunk})
    data = build_data(cfg)
    sized = Partition(
        tuple(idx[:n] for idx, n in zip(data.train.client_indices, SIZES, strict=True))
    )
    return build_engine(cfg, data=dataclasses.replace(data, train=sized))


def _weights(engine: Engine) -> dict[str, torch.Tensor]:
    """The global model's tensors and every client's kept ones (Local-only, Ditto)."""
    model = engine.algorithm.global_model()
    out = {} if model is None else {f"global/{k}": v for k, v in model.state_dict().items()}
    for c, state in engine.client_states.items():
        if isinstance(state, dict):
            out |= {f"{c}/{k}": v for k, v in state.items()}
    if model is None:  # no global model: the server's own tensors (the hypernetworks)
        out |= _tensors(engine.algorithm.state_dict(), "server")
    return out


def _tensors(tree: Any, path: str) -> dict[str, torch.Tensor]:
    """The floating-point tensors of a nested state, by path."""
    if isinstance(tree, torch.Tensor):
        return {path: tree} if tree.is_floating_point() else {}
    if not isinstance(tree, dict | list | tuple):
        return {}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    return {k: v for key, sub in items for k, v in _tensors(sub, f"{path}/{key}").items()}


#: Pa3dFL's cases: widths 1, 1/2, 1/4 and 1, validation records for Algorithm 1
_PA3DFL = {
    "algorithm": "pa3dfl",
    "model": "pa3dfl_cnn_fmnist",
    "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 0.0625, 1.0]},
    "samples_per_client": 100,
    "client_split": {"train": 0.6, "val": 0.2, "test": 0.2},
}
_PA3DFL_HN = {
    "embed_dim": 4,
    "hidden_dim": 8,
    "encoder_depth": 2,
    "n_alpha": 3,
    "power_iterations": 2,
}

CASES = {
    "fedavg": {},
    "fedavg-head": {"algorithm_params": {"trainable": "head"}},
    "fedprox": {"algorithm": "fedprox", "algorithm_params": {"mu": 0.3}},
    "local": {"algorithm": "local"},
    "dp_fedavg": {
        "algorithm": "dp_fedavg",
        "local_epochs": 1,
        "privacy": {"mechanism": "dpsgd", "noise_multiplier": 0.8, "clip": 1.0},
    },
    "fedprox-dpsgd": {
        "algorithm": "fedprox",
        "local_epochs": 1,
        "privacy": {"mechanism": "dpsgd", "noise_multiplier": 0.8, "clip": 1.0},
    },
    "ditto": {"algorithm": "ditto", "algorithm_params": {"lam": 0.5}},
    "ditto-dpsgd": {
        "algorithm": "ditto",
        "local_epochs": 1,
        "privacy": {"mechanism": "dpsgd", "noise_multiplier": 0.8, "clip": 1.0},
    },
    # a small generator; a clipping norm that every step reaches (both groups clipped)
    "hyperfl": {
        "algorithm": "hyperfl",
        "algorithm_params": {"embed_dim": 8, "hidden_dim": 16, "max_grad_norm": 0.05},
    },
    "hyperfl-no-head-step": {
        "algorithm": "hyperfl",
        "algorithm_params": {"embed_dim": 8, "hidden_dim": 16, "head_epochs": 0},
    },
    # a clipping norm the local steps reach
    "pfedhn": {"algorithm": "pfedhn", "algorithm_params": {"max_grad_norm": 0.5}},
    "pfedhn_pc": {"algorithm": "pfedhn_pc", "algorithm_params": {"max_grad_norm": 0.5}},
    # widths padded into the full network (two clients at width 1), validation records for
    # Algorithm 1's selection, the normalized head step, Eq. 32's term, and a clipping norm the
    # local steps reach
    "pa3dfl": _PA3DFL | {"algorithm_params": _PA3DFL_HN | {"max_grad_norm": 2.0}},
    # Algorithm 2's p_min (1/2 of the widths 1, 1/2, 1/4: R1 = T/4) and the factors' lr
    # multipliers capped below every layer's (the vectorized job must cap them as the loop does)
    "pa3dfl-capped": _PA3DFL
    | {"algorithm_params": _PA3DFL_HN | {"rank_p_min": "clients", "step_scale_max": 0.5}},
    # FLANC's decomposition (Table 3's ablation): its V padded the same way
    "pa3dfl-flanc": {
        "algorithm": "pa3dfl",
        "model": "pa3dfl_cnn_fmnist",
        "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 0.0625, 1.0]},
        "algorithm_params": {
            "embed_dim": 4,
            "hidden_dim": 8,
            "encoder_depth": 2,
            "decomposition": "flanc",
        },
    },
    # personal parts kept by the clients; the plain head step
    "pa3dfl-private": {
        "algorithm": "pa3dfl",
        "model": "pa3dfl_cnn_fmnist",
        "capacity": {"name": "fixed", "ratios": [0.5, 1.0, 0.5, 0.25]},
        "algorithm_params": {
            "embed_dim": 4,
            "hidden_dim": 8,
            "encoder_depth": 2,
            "hn_aggregation": False,
            "head_step": "plain",
        },
    },
    # widths padded into the full network, a width drawn a step (self-distillation on)
    "fjord": {
        "algorithm": "fjord",
        "model": "pa3dfl_cnn_fmnist",
        "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 0.0625, 1.0]},
    },
    # rolling windows (a round's windows start past channel 0 from round 2), padded
    "fedrolex": {
        "algorithm": "fedrolex",
        "model": "pa3dfl_cnn_fmnist",
        "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 0.0625, 0.5]},
    },
    # the Scaler at each client's width and the label mask, under a skewed partition
    "heterofl": {
        "algorithm": "heterofl",
        "model": "pa3dfl_cnn_fmnist",
        "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 0.0625, 0.5]},
        "partition": {"name": "dirichlet", "beta": 0.1},
    },
    # the same without the Scaler (algorithm_params.scaler: false)
    "heterofl-noscaler": {
        "algorithm": "heterofl",
        "model": "pa3dfl_cnn_fmnist",
        "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 0.0625, 0.5]},
        "algorithm_params": {"scaler": False},
    },
    # capacity-aware Local-only: each client's width padded into the full network
    "local-widths": {
        "algorithm": "local",
        "model": "pa3dfl_cnn_fmnist",
        "capacity": {"name": "fixed", "ratios": [1.0, 0.25, 0.0625, 0.5]},
    },
    "dp_fedavg_client": {
        "algorithm": "dp_fedavg_client",
        "privacy": {"mechanism": "client", "noise_multiplier": 0.05, "clip": 5.0},
    },
}


#: cases whose paths the others cover too (head-only training; DP-SGD with a proximal term):
#: run with make slow, to keep the default run under 15 minutes
SLOW_CASES = {
    "fedavg-head",
    "fedprox-dpsgd",
    "hyperfl-no-head-step",
    "pfedhn_pc",
    "pa3dfl-private",
    "pa3dfl-flanc",  # Pa3dFL's padded stack with the other decomposition
    "pa3dfl-capped",  # the cap's lr multipliers, also checked directly (test_pa3dfl.py)
    "local-widths",  # the padded cross-entropy path, as fedrolex's
    "heterofl-noscaler",  # heterofl's path with the Scaler at 1
}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c for c in sorted(CASES)],
)
def test_vectorized_equals_the_loop_in_float64(tiny_config: dict, float64: None, case: str):
    raw = _config(tiny_config, **CASES[case])
    loop, vec = _engine(raw, "loop"), _engine(raw, "vectorized")
    assert (loop.executor, vec.executor) == ("loop", "vectorized")
    loop.run()
    vec.run()
    a, b = _weights(loop), _weights(vec)
    assert a.keys() == b.keys() and a
    for k in a:
        assert a[k].dtype == torch.float64
        assert torch.allclose(a[k], b[k], rtol=0, atol=1e-9), (k, (a[k] - b[k]).abs().max())
    for ra, rb in zip(loop.history, vec.history, strict=True):
        for key in ("train_loss", "accuracy", "accuracy_before", "epsilon", "round_bytes_up"):
            x, y = ra.metrics.get(key), rb.metrics.get(key)
            assert (x is None) == (y is None), key
            if x is not None:
                assert x == pytest.approx(y, rel=1e-9, abs=1e-12), key


def test_chunks_change_nothing_and_are_logged(
    tiny_config: dict, float64: None, caplog: pytest.LogCaptureFixture
) -> None:
    raw = _config(tiny_config, **CASES["dp_fedavg"])
    whole = _engine(raw, "vectorized")
    whole.run()
    with caplog.at_level(logging.INFO, logger="flcore.vectorized"):
        chunked = _engine(raw, "vectorized", chunk=3)
        chunked.run()
    assert "chunks of 3 clients" in caplog.text
    a, b = _weights(whole), _weights(chunked)
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=1e-9), k


def test_auto_keeps_the_loop_on_cpu(tiny_config: dict) -> None:
    assert _engine(_config(tiny_config), "auto").executor == "loop"


@pytest.mark.parametrize(
    "extra, reason",
    [
        ({"algorithm": "moon"}, "moon trains its clients with its own local procedure"),
        ({"optimizer": {"name": "adam"}}, "optimizer 'adam'"),
    ],
)
def test_vectorized_refuses_what_it_cannot_run(tiny_config: dict, extra: dict, reason: str):
    cfg = validate_config(_config(tiny_config, **extra) | {"executor": "vectorized"})
    with pytest.raises(ConfigError, match=reason) as err:
        build_engine(cfg)
    assert err.value.key == "executor"
    # auto falls back to the loop for the same run
    assert build_engine(cfg.model_copy(update={"executor": "auto"})).executor == "loop"


def test_subclasses_do_not_inherit_vectorized() -> None:
    from flcore.algorithms.base import ALGORITHMS

    vectorized = sorted(n for n in ALGORITHMS.names() if ALGORITHMS.get(n).vectorizable())
    assert vectorized == [
        "ditto",
        "dp_fedavg",
        "dp_fedavg_client",
        "fedavg",
        "fedprox",
        "fedrolex",
        "fjord",
        "heterofl",
        "hyperfl",
        "local",
        "pa3dfl",
        "pfedhn",
        "pfedhn_pc",
    ]


def test_poisson_table_takes_the_step_by_step_batches() -> None:
    """On CUDA the DP-SGD batches of every step are drawn at once: the same batches as one
    draw a step from each client's generator, padded, with each step's width."""
    from types import SimpleNamespace

    from flcore.executor import client_generator
    from flcore.vectorized import VectorizedExecutor

    rows = [torch.arange(100, 130), torch.arange(7), torch.arange(500, 561)]
    q, steps = [0.2, 0.5, 0.1], torch.tensor([4, 2, 5])
    gens = [client_generator(1, 2, k) for k in range(3)]
    this = SimpleNamespace(device=torch.device("cpu"))
    idx, mask, widths = VectorizedExecutor._poisson_table(this, gens, rows, q, steps, 5)
    again = [client_generator(1, 2, k) for k in range(3)]
    for s in range(5):
        picks = [
            row[(torch.rand(len(row), generator=g) < qk).nonzero().flatten()]
            if s < int(steps[k])
            else torch.zeros(0, dtype=torch.long)
            for k, (g, row, qk) in enumerate(zip(again, rows, q, strict=True))
        ]
        assert widths[s] == max(1, max(len(p) for p in picks))
        for k, p in enumerate(picks):
            assert torch.equal(idx[k, s][mask[k, s]], p), (s, k)
            assert int(mask[k, s].sum()) == len(p)
