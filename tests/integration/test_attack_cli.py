"""`fedsweep attack` and `fedsweep run` with an attack: the real console script on real FMNIST,
a real sqlite MLflow store, the image grid as an artifact, bad input refused before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sweeps.tracking import mlflow_client
from tests.integration.sweep_helpers import cli, cli_in_process


@pytest.fixture
def attack_config(tiny_config: dict, tmp_path: Path) -> Path:
    cfg = tmp_path / "attack.yaml"
    raw = tiny_config | {
        "experiment": "attacks",
        "rounds": 3,
        "attack": {"name": "ig", "rounds": [2], "clients": [1], "images": 2, "iterations": 30},
    }
    cfg.write_text(yaml.safe_dump(raw))
    return cfg


def _store(tmp_path: Path):  # type: ignore[no-untyped-def]
    return mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")


def test_attack_json_mlflow_and_grid(attack_config: Path, tmp_path: Path) -> None:
    out = cli(["attack", str(attack_config), "--json"], tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert out.stdout.count("\n") == 1
    assert {"leak_psnr", "leak_ssim", "leak_lpips", "images", "iterations"} <= set(doc)
    assert doc["images"] == 2 and doc["iterations"] == 30 and doc["rounds"] == [2]
    assert 0 < doc["leak_psnr"] < 100 and -1 <= doc["leak_ssim"] <= 1
    assert doc["leak_psnr_max"] >= doc["leak_psnr"]
    # leak_identified with what it corrects: the fraction identified and a guess's chance
    assert doc["identified_chance"] == pytest.approx(1 / 21)
    assert doc["identified_rate"] in (0.0, 0.5, 1.0)  # two records attacked
    assert doc["identified_by"] in ("ssim", "lpips")
    if doc["leak_lpips"] is None:  # no AlexNet weights on this machine: said why
        assert "AlexNet" in doc["lpips_reason"]
    client = _store(tmp_path)
    run = client.get_run(doc["run_id"])
    assert run.data.metrics["leak_psnr"] == pytest.approx(doc["leak_psnr"])
    assert run.data.tags["attack"] == "ig" and run.data.tags["fedsweep.kind"] == "attack"
    assert run.data.tags["attack.labels"] == "given"  # the default: one threat model for all
    # which closeness leak_identified used on this machine (LPIPS needs its weights file)
    expected_by = "ssim" if doc["leak_lpips"] is None else "lpips"
    assert run.data.tags["leak_identified_by"] == expected_by
    # training stopped after the attacked round: round 3 never ran
    assert [m.step for m in client.get_metric_history(doc["run_id"], "round_seconds")] == [1, 2]
    files = [f.path for f in client.list_artifacts(doc["run_id"], "attack")]
    assert files == ["attack/reconstructions.png"]
    assert Path(doc["grid"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_with_an_attack_reports_leakage_and_local_has_none(
    attack_config: Path, tmp_path: Path
) -> None:
    # in this process (test_attack_json_mlflow_and_grid runs the console script)
    out = cli_in_process(["run", str(attack_config), "--json"], tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["rounds"] == 3 and doc["leak_images"] == 2 and doc["leak_psnr"] > 0
    out = cli_in_process(
        ["attack", str(attack_config), "--set", "algorithm=local", "--json"], tmp_path
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["leak_psnr"] is None and doc["leak_ssim"] is None and doc["leak_lpips"] is None
    assert doc["reason"] == "nothing uploaded" and doc["images"] == 0
    tags = _store(tmp_path).get_run(doc["run_id"]).data.tags
    assert tags["leak_reason"] == "nothing uploaded"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("attack.name=rog", "unknown attack 'rog'"),
        ("attack.rounds=[9]", "attack.rounds"),
        ("attack.clients=[7]", "attack.clients"),
        ("attack.images=3", "multiple of attack.batch"),
        ("attack.params.tv=-1", "attack.tv"),
        ("attack.name=hyperfl_tailored", "not 'fedavg'"),
    ],
)
def test_bad_attack_configs_exit_2_before_any_work(
    attack_config: Path, tmp_path: Path, override: str, message: str
) -> None:
    extra = ["--set", "attack.batch=2"] if "images=3" in override else []
    out = cli_in_process(["attack", str(attack_config), "--set", override, *extra], tmp_path)
    assert out.returncode == 2
    assert message in out.stderr
    assert not (tmp_path / "mlflow.db").exists()
