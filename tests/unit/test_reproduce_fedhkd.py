"""benchmarks/reproduce_fedhkd.py on a tiny real-FMNIST override: it runs, stops at
--until-round, resumes to the end, skips an ended run, summarises with the claims, and needs no
Ray, MLflow or Optuna."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "reproduce_fedhkd.py"

_DRIVER = """
import contextlib, io, json, runpy, sys
sys.argv = [sys.argv[0]]
mod = runpy.run_path({script!r}, run_name="reproduce")
docs = []
for extra in ({first!r}, [], []):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        mod["main"]([*{common!r}, *extra])
    docs.append(json.loads(buf.getvalue()))
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    mod["main"](["--summary", "--out", {out!r}, "--records", {records!r}])
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & {{"ray", "mlflow", "optuna"}})
print(json.dumps({{"docs": docs, "summary": buf.getvalue(), "heavy": heavy}}))
"""


@pytest.mark.slow  # four runs in a fresh interpreter plus --summary: ~20 s on a loaded machine
def test_a_tiny_run_stops_resumes_ends_and_summarises(data_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    common = ["--methods", "fedavg", "fedhkd", "--settings", "n10-b0.5", "--seeds", "0"]
    records = str(tmp_path / "records")
    common += ["--rounds", "2", "--workers", "1", "--out", str(out), "--records", records]
    for over in (f"data_root={data_root}", "samples_per_client=60", "local_epochs=1"):
        common += ["--set", over]
    common += ["--label", "tiny", "--set", "global_test_per_class=20", "--global-eval-every", "2"]
    driver = _DRIVER.format(
        script=str(SCRIPT),
        common=common,
        first=["--until-round", "1"],
        out=str(tmp_path / "elsewhere"),  # the summary from the records alone
        records=records,
    )
    done = subprocess.run(
        [sys.executable, "-c", driver], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["heavy"] == []  # flcore alone: no Ray, MLflow or Optuna imported

    first, second, third = (d["runs"] for d in result["docs"])
    assert [r["run"] for r in first] == ["n10-b0.5-fedavg-tiny-s0", "n10-b0.5-fedhkd-tiny-s0"]
    assert [(r["rounds_done"], r["ended"]) for r in first] == [(1, False), (1, False)]
    assert [(r["rounds_done"], r["ended"]) for r in second] == [(2, True), (2, True)]
    assert third == second  # ended runs are only read back
    hkd = second[1]
    assert hkd["epsilon"] == float("inf") and hkd["epsilon_knowledge"] > 0
    assert 0 <= hkd["knowledge_classes_shared"] <= 10
    assert hkd["bytes_up_per_client_round"] > second[0]["bytes_up_per_client_round"]
    rows = [json.loads(line)["round"] for line in (out / first[1]["run"] / "metrics.jsonl").open()]
    assert rows == [1, 2]
    assert json.loads((out / first[1]["run"] / "code.json").read_text())["rounds"] == 2
    # labelled variants are shown in the table, and claims they do not cover stay unmeasured;
    # the summary was read from the two runs' records alone (its OUT holds no run)
    assert "fedhkd (tiny)" in result["summary"] and "not measured" in result["summary"]
    assert sorted(p.name for p in Path(records).iterdir()) == [
        "n10-b0.5-fedavg-tiny-s0.json",
        "n10-b0.5-fedhkd-tiny-s0.json",
    ]
    # --global-eval-every reaches the runs' configs: FedAvg's global model measured at round 2
    fedavg = json.loads((Path(records) / "n10-b0.5-fedavg-tiny-s0.json").read_text())
    assert fedavg["config"]["global_eval_every"] == 2
    columns, rows = fedavg["curve"]["columns"], fedavg["curve"]["rows"]
    measured = [row[0] for row in rows if row[columns.index("global_accuracy")] is not None]
    assert measured == [2]


def test_a_claim_needs_three_seeds_and_a_difference_beyond_the_noise() -> None:
    import runpy

    compare = runpy.run_path(str(SCRIPT), run_name="reproduce")["compare"]
    assert compare([], [1.0], ">=")[0] == "not measured"
    assert compare([90.0], [80.0], ">=")[0] == "inconclusive"  # one seed decides nothing
    assert compare([90.0, 90.5, 89.5], [80.0, 80.5, 79.5], ">=")[0] == "supported"
    assert compare([80.0, 80.5, 79.5], [90.0, 90.5, 89.5], ">=")[0] == "NOT supported"
    # a 0.3-point difference inside seed noise of about 2 points decides nothing
    assert compare([88.0, 90.0, 92.0], [88.0, 89.5, 91.6], ">")[0] == "inconclusive"
    assert compare([85.0, 85.5, 84.5], [84.5, 84.8, 84.2], "~")[0] == "supported"
    assert compare([88.0, 88.5, 87.5], [85.0, 85.5, 84.5], "~")[0] == "NOT supported"


def test_the_table_reports_each_rows_weakest_epsilon() -> None:
    import runpy

    table = runpy.run_path(str(SCRIPT), run_name="reproduce")["summary_table"]

    def run(method: str, seed: int, epsilon: float | str | None) -> dict:
        summary = {"rounds": 50, "accuracy": 0.5, "global_accuracy": 0.4, "epsilon": epsilon}
        return {"setting": "n10-b0.5", "method": method, "label": "", "seed": seed,
                "summary": summary, "ended": True}  # fmt: skip

    rows = table([run("fedhkd_dp", 0, 7.99), run("fedhkd_dp", 1, 8.01), run("fedhkd", 0, "inf")])
    split = [line.split("|") for line in rows.splitlines()[2:]]
    cells = {parts[2].strip(): parts[7].strip() for parts in split}
    assert cells == {"fedhkd_dp": "8.01", "fedhkd": "inf"}  # the larger of the two seeds
    assert table([run("fedavg", 0, None)]).splitlines()[2].rstrip("|").endswith("| - ")


def test_the_table_averages_ended_seeds_and_names_a_paused_one_beside_them(
    tmp_path: Path,
) -> None:
    import runpy

    mod = runpy.run_path(str(SCRIPT), run_name="reproduce")

    def folder(name: str, rounds: int, accuracy: float, planned: int | None = 50) -> None:
        run = tmp_path / name
        run.mkdir()
        summary = {"rounds": rounds, "accuracy": accuracy, "global_accuracy": accuracy}
        (run / "summary.json").write_text(json.dumps(summary))
        if planned is not None:  # resume_run's code.json: the rounds the run is to do
            (run / "code.json").write_text(json.dumps({"started": {}, "rounds": planned}))

    folder("n10-b0.5-fedavg-s0", 50, 0.80)
    folder("n10-b0.5-fedavg-s1", 50, 0.82)
    folder("n10-b0.5-fedavg-s2", 23, 0.40)  # paused at round 23 of 50
    folder("n10-b0.5-fedprox-s0", 20, 0.50, planned=None)  # older folder: the config's 50
    folder("n10-b0.5-fedhkd-short-s0", 10, 0.70, planned=10)  # a 10-round variant, ended
    runs = mod["read_runs"](tmp_path)
    assert [r["ended"] for r in runs] == [True, True, False, True, False]
    rows = {line.split("|")[2].strip(): line for line in mod["summary_table"](runs).splitlines()}
    assert rows["fedavg"].startswith("| n10-b0.5 | fedavg | 2 (+1 under way) | 50 | 81.00 ± 1.41;")
    assert "under way: seed 2 at round 23 (40.00 so far)" in rows["fedavg"]
    assert rows["fedprox"].startswith("| n10-b0.5 | fedprox | 1 | 20 | 50.00 |")  # none ended
    assert rows["fedhkd (short)"].startswith("| n10-b0.5 | fedhkd (short) | 1 | 10 | 70.00 |")


def test_claims_count_only_ended_runs_and_pair_the_gain_by_seed() -> None:
    import runpy

    claims = runpy.run_path(str(SCRIPT), run_name="reproduce")["claims"]

    def run(setting: str, method: str, seed: int, glob: float, rounds: int = 50) -> dict:
        summary = {"rounds": rounds, "accuracy": 0.8, "global_accuracy": glob}
        return {"setting": setting, "method": method, "label": "", "seed": seed,
                "summary": summary}  # fmt: skip

    # FedHKD's gain over FedAvg at beta 0.2: +2 on seeds 0-2; a run paused at round 20 does
    # not count, and FedAvg's seed 3 has no FedHKD partner
    runs = [run("n10-b0.2", "fedhkd", s, 0.82 + 0.001 * s) for s in range(3)]
    runs += [run("n10-b0.2", "fedavg", s, 0.80 + 0.001 * s) for s in (0, 1, 2, 3)]
    runs += [run("n10-b0.2", "fedhkd", 3, 0.10, rounds=20)]
    # at beta 0.5 the gain is -2 on seeds 1-3 (FedAvg's seeds 1-3, listed in another order)
    runs += [run("n10-b0.5", "fedhkd", s, 0.78 + 0.001 * s) for s in (1, 2, 3)]
    runs += [run("n10-b0.5", "fedavg", s, 0.80 + 0.001 * s) for s in (3, 1, 2)]
    four = claims(runs)[3]
    assert four.startswith("4.") and "[+4.00 (3/3 seeds), supported; -; " in four  # beta 5 not run


def test_the_rank_claim_needs_every_method_and_two_methods_beyond_the_noise_to_fail() -> None:
    import runpy

    mod = runpy.run_path(str(SCRIPT), run_name="reproduce")
    claims, methods = mod["claims"], mod["TABLE1_METHODS"]

    def runs(local: dict[str, float], setting: str = "n20-b0.5") -> list[dict]:
        """Three seeds of each method, its local accuracy spread +-0.5 points around ``local``."""
        return [
            {"setting": setting, "method": m, "label": "", "seed": s,
             "summary": {"rounds": 50, "accuracy": (acc + 0.5 * (s - 1)) / 100,
                         "global_accuracy": 0.80}}
            for m, acc in local.items() for s in range(3)
        ]  # fmt: skip

    def local_rank(local: dict[str, float]) -> str:
        seven = claims(runs(local))[6]
        assert seven.startswith("7.")
        return seven.split("[")[1].split(";")[2].strip()  # n20-b0.5's local part

    base = {m: 85.0 for m in methods}
    assert "rank 1/9" in local_rank({**base, "fedhkd": 86.0})
    assert "rank 2/9, fedmd +1.00" in local_rank({**base, "fedhkd": 86.0, "fedmd": 87.0})
    # every verdict on its own: supported (first or second), NOT supported (two methods far
    # ahead), inconclusive (methods ahead inside the seed noise), not measured (a method missing)
    rank = mod["rank"]
    group = mod["_group"]
    g = group(runs({**base, "fedhkd": 86.0, "fedmd": 87.0}))
    assert rank(g, "n20-b0.5", "accuracy")[0] == "supported"
    g = group(runs({**base, "fedhkd": 86.0, "fedmd": 88.0, "moon": 88.0}))
    assert rank(g, "n20-b0.5", "accuracy") == ("NOT supported", "rank 3/9, moon +2.00 (3 seeds)")
    g = group(runs({**base, "fedhkd": 86.0, "fedmd": 86.1, "moon": 86.1}))
    assert rank(g, "n20-b0.5", "accuracy")[0] == "inconclusive"
    # FedHKD first, but one baseline has a single seed: no verdict yet
    one_seed = [
        r for r in runs({**base, "fedhkd": 86.0}) if r["method"] != "fedgen" or r["seed"] == 0
    ]
    assert rank(group(one_seed), "n20-b0.5", "accuracy") == (
        "inconclusive",
        "rank 1/9, fedavg -1.00 (1-3 seeds)",
    )
    g = group(runs({m: a for m, a in base.items() if m != "fedgen"}))
    assert rank(g, "n20-b0.5", "accuracy") == ("not measured", "-")
    # the DP variant is not one of Table 1's methods
    assert "fedhkd_dp" not in methods and len(methods) == 9
