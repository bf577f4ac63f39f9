"""benchmarks/pa3dfl_clients.py: one more evaluated round for chosen clients of a run, from
its checkpoint, on a tiny real-FMNIST Pa3dFL run; nothing written."""

from __future__ import annotations

import hashlib
import runpy
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "pa3dfl_clients.py"
CONFIG = ROOT / "sweeps" / "configs" / "pa3dfl" / "fmnist_hetero_pa3dfl.yaml"


def test_the_probe_reenters_a_checkpoint_for_the_chosen_widths(
    data_root: Path, tmp_path: Path
) -> None:
    from flcore.config import load_config
    from flcore.experiment import build_capacity, build_engine

    over = [f"data_root={data_root}", "num_clients=6", "samples_per_client=50",
            "global_test_per_class=50", "local_epochs=1", "rounds=3", "seed=0",
            "workers=1", "algorithm_params.power_iterations=2"]  # fmt: skip
    engine = build_engine(load_config(CONFIG, over))
    next(engine.iter_rounds())
    ckpt = tmp_path / "checkpoint.pt"
    torch.save(engine.state_dict(), ckpt)
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    probe = runpy.run_path(str(SCRIPT), run_name="probe")["probe"]

    out = probe(tmp_path, CONFIG, over, None)

    capacity = build_capacity(load_config(CONFIG, over))
    assert capacity is not None
    levels = list(capacity.levels)
    assert out["round"] == 2 and out["widths"] == sorted({*levels[:2], levels[-1]})
    expected = [c for w in out["widths"] for c in capacity.clients_of(w)]
    assert [row["client"] for row in out["clients"]] == expected
    for row in out["clients"]:
        assert row["width"] == row["model_width"] == capacity.width(row["client"])
        assert row["train_loss"] > 0 and 0 <= row["accuracy"] <= 1
        assert 0 <= row["accuracy_before"] <= 1
        assert row["train_feature_norm"] > 0  # Pa3dFL: both heads on the training records
        share = row["global_head_class_share"]
        assert len(share) == 10 and sum(share) == pytest.approx(1.0)
        for head in ("global_head", "local_head"):
            assert row[f"train_ce_{head}"] > 0 and 0 <= row[f"train_accuracy_{head}"] <= 1
    assert hashlib.sha256(ckpt.read_bytes()).hexdigest() == digest  # nothing written
    with pytest.raises(SystemExit, match="no client of width"):
        probe(tmp_path, CONFIG, over, [0.3])
    with pytest.raises(SystemExit, match="no checkpoint.pt"):
        probe(tmp_path / "none", CONFIG, over, None)
