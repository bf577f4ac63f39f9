"""Issue 24: what a width-p client receives, for the capacity-aware methods the HeteroFL / FjORD /
FedRolex test (test_width_slicing.py) does not cover, and that its bytes down are exactly that
payload's. Each method's payload is checked against the plain width-p model of
``pa3dfl_cnn_fmnist`` (``model_spec(width=p)``):

- Pa3dFL: the shared U (every width the same) and the HN's V pruned to width p, whose
  recovered weights are the width-p model's; its local head at width p (the global head is
  fixed and never sent);
- FLANC: the shared basis and width p's coefficients, whose composition is the width-p model;
- TailorFL: the width-p submodel of the filters it keeps, plus their importance scores;
- pFedGate: the dense model at every width (its masks are the client's own; module docstring);
- LG-FedAvg: the global head at width p; Local-only: nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import flcore.algorithms.lg_fedavg  # noqa: F401  (registers)
import flcore.algorithms.local  # noqa: F401  (registers)
import flcore.algorithms.widths.flanc  # noqa: F401  (registers)
import flcore.algorithms.widths.pa3dfl  # noqa: F401  (registers)
import flcore.algorithms.widths.pfedgate  # noqa: F401  (registers)
import flcore.algorithms.widths.tailorfl  # noqa: F401  (registers)
from flcore.config import validate_config
from flcore.experiment import build_engine

RATIOS = [1.0, 0.25, 0.0625]
WIDTHS = [1.0, 0.5, 0.25]


def _engine(data_root: Path, algorithm: str):  # type: ignore[no-untyped-def]
    return build_engine(
        validate_config(
            {
                "algorithm": algorithm,
                "dataset": "fmnist",
                "data_root": str(data_root),
                "model": "pa3dfl_cnn_fmnist",
                "capacity": {"name": "fixed", "ratios": RATIOS},
                "client_split": {"train": 0.6, "val": 0.2, "test": 0.2},
                "num_clients": 3,
                "client_fraction": 1.0,
                "global_test_per_class": 20,
                "samples_per_client": 60,
                "rounds": 1,
                "local_epochs": 1,
                "batch_size": 20,
                "lr": 0.05,
                "eval_every": 100,
                "workers": 1,
                "seed": 5,
            }
        )
    )


def _shapes(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state.items()}


def _check_pa3dfl(alg, payload, width, reference) -> None:  # type: ignore[no-untyped-def]
    net = alg.build_net(width)
    missing, unexpected = net.load_state_dict(payload, strict=False)
    assert sorted(missing) == ["head.bias", "head.weight"] and not unexpected  # fixed, not sent
    assert _shapes(net.recovered_state("local")) == _shapes(reference)
    for q, wide in zip(alg.plans(width), alg.plans(1.0), strict=True):
        assert torch.equal(payload[f"{q.key}.U"], alg.U[f"{q.key}.U"])  # U: the same for all
        v = payload[f"{q.key}.V"]
        assert tuple(v.shape) == q.v_shape()
        if width < 1.0:  # V pruned: fewer of its columns than the full width's
            assert v.numel() < torch.Size(wide.v_shape()).numel()


def _check_flanc(alg, payload, width, reference) -> None:  # type: ignore[no-untyped-def]
    assert _shapes(alg.decomposition.weights(payload, width)) == _shapes(reference)
    for k, v in alg.basis.items():
        assert torch.equal(payload[k], v)  # one basis for every width


def _check_tailorfl(alg, payload, width, reference) -> None:  # type: ignore[no-untyped-def]
    weights = {k: v for k, v in payload.items() if not k.startswith("importance.")}
    assert _shapes(weights) == _shapes(reference)
    kept = {
        k.split(".", 1)[1]: v.numel() for k, v in payload.items() if k.startswith("importance.")
    }
    assert sorted(kept.values()) == sorted(
        [reference[k].shape[0] for k in reference if k.endswith(".weight") and k != "head.weight"]
    )


def _check_pfedgate(alg, payload, width, reference) -> None:  # type: ignore[no-untyped-def]
    assert _shapes(payload) == _shapes(alg.model_spec(width=1.0).state_dict())


def _check_lg_fedavg(alg, payload, width, reference) -> None:  # type: ignore[no-untyped-def]
    assert _shapes(payload) == {k: tuple(reference[k].shape) for k in ("head.weight", "head.bias")}
    n_in = reference["head.weight"].shape[1]
    assert torch.equal(payload["head.weight"], alg.head["head.weight"][:, :n_in])


def _check_local(alg, payload, width, reference) -> None:  # type: ignore[no-untyped-def]
    assert payload == {}


CHECKS = {
    "pa3dfl": _check_pa3dfl,
    "flanc": _check_flanc,
    "tailorfl": _check_tailorfl,
    "pfedgate": _check_pfedgate,
    "lg_fedavg": _check_lg_fedavg,
    "local": _check_local,
}


@pytest.mark.parametrize("algorithm", list(CHECKS))
def test_a_width_p_client_receives_its_methods_width_p_payload_and_its_bytes(
    data_root: Path, algorithm: str
) -> None:
    engine = _engine(data_root, algorithm)
    alg = engine.algorithm
    expected = {}
    for cid, width in enumerate(WIDTHS):
        assert alg.client_width(cid) == width
        payload = alg.broadcast(1, cid)
        reference = alg.model_spec(width=width).state_dict()
        CHECKS[algorithm](alg, payload, width, reference)
        assert all(v.dtype == torch.float32 for v in payload.values())
        expected[cid] = 4.0 * sum(v.numel() for v in payload.values())
    if algorithm not in ("pfedgate", "local"):
        assert expected[0] > expected[1] > expected[2]  # narrower clients receive less
    engine.run()
    costs = engine.client_costs()
    for cid in range(len(WIDTHS)):
        assert costs[cid]["bytes_down"] == expected[cid], cid
