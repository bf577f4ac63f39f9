"""benchmarks/reproduce_table3.py keeps IG's optimisation state beside the round's result while
the attack runs (so a killed attack resumes) and removes it once the result is written."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "reproduce_table3.py"


def _run(monkeypatch: pytest.MonkeyPatch, out: Path, *, keep_state: bool, extra=()) -> dict:  # type: ignore[type-arg,no-untyped-def]
    args = ["--methods", "fedavg", "--attack-rounds", "1", "--iterations", "3", "--images", "1"]
    args += list(extra)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args, "--out", str(out)])
    mod = runpy.run_path(str(SCRIPT), run_name="reproduce_table3")
    if keep_state:  # what a kill after the attack's last save leaves behind
        monkeypatch.setitem(mod["attack_one"].__globals__, "shutil", _NoRemove())
    mod["main"]()
    return json.loads((out / "ig-fedavg-r1.json").read_text())


class _NoRemove:
    @staticmethod
    def rmtree(*_args: object, **_kwargs: object) -> None:
        pass


def test_the_attack_state_is_saved_beside_the_result_and_removed_after(
    data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = _run(monkeypatch, tmp_path / "kept", keep_state=True)
    states = list((tmp_path / "kept" / "ig-fedavg-r1.state").glob("ig-*.pt"))
    assert len(states) == 1
    assert torch.load(states[0], weights_only=False)["iteration"] == 3
    assert kept["round"] == 1 and kept["leak_images"] == 1
    monkeypatch.undo()
    clean = _run(monkeypatch, tmp_path / "clean", keep_state=False)
    assert not (tmp_path / "clean" / "ig-fedavg-r1.state").exists()
    assert clean["leak_psnr"] == kept["leak_psnr"]  # the same attack, state kept or not


def test_a_recheck_re_decides_which_uploads_carried_their_record(
    data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _run(monkeypatch, tmp_path, keep_state=False)
    assert first["records"][0]["informative"] is True  # FedAvg's one-record step at round 1
    assert first["leak_informative"] == 1.0
    # a result saved under an older rule that called the upload empty
    path = tmp_path / "ig-fedavg-r1.json"
    old = first | {"leak_informative": 0.0, "leak_identified_informative": None}
    old["records"] = [first["records"][0] | {"informative": False}]
    path.write_text(json.dumps(old))
    monkeypatch.undo()
    again = _run(monkeypatch, tmp_path, keep_state=False, extra=["--check-cached"])
    assert again["records"][0]["informative"] is True
    assert again["leak_informative"] == 1.0
    assert again["leak_identified_informative"] == first["leak_identified_informative"]
    assert again["leak_psnr"] == first["leak_psnr"]  # the attack's own scores are kept


def test_a_result_saved_before_the_p_value_gets_it_from_its_records(
    data_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from flcore.attacks.baselines import chance_tail

    first = _run(monkeypatch, tmp_path, keep_state=False)
    hits = [r["identified"] for r in first["records"]]
    assert first["leak_identified_p"] == pytest.approx(chance_tail(hits, [1 / 21] * len(hits)))
    path = tmp_path / "ig-fedavg-r1.json"
    path.write_text(json.dumps({k: v for k, v in first.items() if k != "leak_identified_p"}))
    monkeypatch.undo()
    capsys.readouterr()
    _run(monkeypatch, tmp_path, keep_state=False)  # reuses the saved result
    (row,) = json.loads(capsys.readouterr().out)["results"]
    assert row["leak_identified_p"] == pytest.approx(first["leak_identified_p"])
