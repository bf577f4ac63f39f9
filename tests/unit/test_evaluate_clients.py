"""Engine.evaluate_clients: every client's accuracies from the current state, on tiny real
Fashion-MNIST runs of Pa3dFL's configs; the engine is left exactly as it was."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from flcore.config import load_config
from flcore.engine import Engine
from flcore.experiment import build_data, build_engine
from flcore.testing.algorithm_contract import state_equal

ROOT = Path(__file__).resolve().parents[2]
PA3DFL = ROOT / "sweeps" / "configs" / "pa3dfl"
LODMETA = ROOT / "sweeps" / "configs" / "lodmeta" / "fmnist_lodmeta.yaml"


def _over(data_root: Path, fraction: float) -> list[str]:
    return [f"data_root={data_root}", "num_clients=6", "samples_per_client=50",
            "local_epochs=1", "rounds=4", "seed=0", "workers=1", "global_test_per_class=50",
            f"client_fraction={fraction}", "full_last_round=false"]  # fmt: skip


def _engine(method: str, over: list[str]) -> Engine:
    if method == "pa3dfl":  # two power-iteration steps per HN step size (20 dominated its start)
        over = [*over, "algorithm_params.power_iterations=2"]
    cfg = load_config(PA3DFL / f"fmnist_hetero_{method}.yaml", over)
    return build_engine(cfg, data=build_data(cfg))


@pytest.mark.parametrize(
    ("method", "executor"),
    [("fedavg", "loop"), ("ditto", "loop"), ("pa3dfl", "loop"), ("fjord", "vectorized")],
)
def test_all_clients_equal_the_next_full_round_and_nothing_changes(
    method: str, executor: str, data_root: Path
) -> None:
    """With every client in every round, the evaluation of all clients is the next round's
    client evaluation, value for value; and the engine's next round is what it would have been
    without the evaluation (state, client states and metrics). The engine's own executor runs
    the clients (the vectorized one too)."""
    over = [*_over(data_root, 1.0), f"executor={executor}"]
    engine, twin = _engine(method, over), _engine(method, over)
    assert engine.executor == executor
    for e in (engine, twin):
        next(e.iter_rounds())
    before = copy.deepcopy((engine.algorithm.state_dict(), engine.client_states))

    out = engine.evaluate_clients()

    assert state_equal(before, (engine.algorithm.state_dict(), engine.client_states))
    assert engine.round == 1 and len(engine.history) == 1
    assert out["clients"] == 6 and out["round"] == 2
    rows = out["per_client"]
    assert [r["client"] for r in rows] == list(range(6))
    capacity = engine.algorithm.capacity
    assert capacity is not None
    # the test loss and the algorithm's own client metrics (Pa3dFL's Algorithm 1 alpha) too
    measured = ("accuracy", "accuracy_before", "val_accuracy", "val_accuracy_before", "test_loss")
    extra = engine.algorithm.client_metrics
    assert extra == (("selected_alpha",) if method == "pa3dfl" else ())
    for key in (*measured, *extra):
        assert out[key] == pytest.approx(float(np.mean([r[key] for r in rows])), abs=1e-12)
    for width in capacity.levels:
        label = f"{width:.6g}"
        cluster = [r["accuracy"] for r in rows if r["width"] == width]
        assert out[f"accuracy_width_{label}"] == pytest.approx(float(np.mean(cluster)))
    assert out["accuracy_worst_width"] == min(
        v for k, v in out.items() if k.startswith("accuracy_width_")
    )
    # the real next round, every client sampled, measures exactly the same
    r2 = next(engine.iter_rounds()).metrics
    t2 = next(twin.iter_rounds()).metrics
    for key in ("accuracy", "accuracy_before", "val_accuracy", "accuracy_worst_width", "test_loss",
                *extra):  # fmt: skip
        assert out[key] == pytest.approx(r2[key], abs=1e-12)
    for key in ("train_loss", "accuracy", "accuracy_before", "global_accuracy"):
        assert r2[key] == t2[key] or (r2[key] is None and t2[key] is None)
    assert state_equal(engine.algorithm.state_dict(), twin.algorithm.state_dict())


def test_chosen_clients_and_refusals(data_root: Path) -> None:
    engine = _engine("fedavg", _over(data_root, 0.5))
    next(engine.iter_rounds())
    out = engine.evaluate_clients([4, 1, 4])
    assert out["clients"] == 2 and [r["client"] for r in out["per_client"]] == [1, 4]
    # FedAvg deploys the global model: a client's accuracy_before is the model it receives
    assert all(0 <= r["accuracy_before"] <= 1 for r in out["per_client"])
    with pytest.raises(ValueError, match=r"client ids must be in \[0, 6\)"):
        engine.evaluate_clients([0, 6])
    with pytest.raises(ValueError, match="client ids"):
        engine.evaluate_clients([])


def test_a_walk_is_refused(data_root: Path) -> None:
    cfg = load_config(LODMETA, [f"data_root={data_root}", "rounds=2", "workers=1"])
    engine = build_engine(cfg, data=build_data(cfg))
    with pytest.raises(ValueError, match="measures its clients on the server"):
        engine.evaluate_clients()
    # nor can a walk report every client on its best state: refused before any round
    with pytest.raises(ValueError, match="all_clients"):
        Engine(
            engine.factory,
            engine.data,
            rounds=2,
            early_stopping_metric="val_accuracy",
            early_stopping_report="all_clients",
        )
