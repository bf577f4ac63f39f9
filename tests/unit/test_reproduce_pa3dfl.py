"""benchmarks/reproduce_pa3dfl_table1.py on a tiny real-FMNIST override: it runs, stops at
--until-round, resumes to the end, skips an ended run, leaves its record, summarises (from the
folder or the record alone), and needs no Ray, MLflow or Optuna."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "reproduce_pa3dfl_table1.py"

# Runs the script's main() three times in one fresh interpreter (one torch import), then says
# which of the heavy sweep libraries that process imported.
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
heavy = sorted({{m.split(".")[0] for m in sys.modules}} & {{"ray", "mlflow", "optuna"}})
print(json.dumps({{"docs": docs, "heavy": heavy}}))
"""


@pytest.mark.slow  # three runs in a fresh interpreter plus --summary: ~24 s on a loaded machine
def test_a_tiny_run_stops_resumes_ends_and_summarises(data_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    common = [
        "--methods",
        "local",
        "--settings",
        "hetero",
        "--seeds",
        "0",
        "--rounds",
        "2",
        "--workers",
        "1",
        "--out",
        str(out),
        "--records",
        str(tmp_path / "records"),
        "--label",
        "tiny",
        "--set",
        f"data_root={data_root}",
        "--set",
        "num_clients=4",
        "--set",
        "samples_per_client=50",
        "--set",
        "local_epochs=1",
        "--global-eval-every",
        "5",
    ]
    driver = _DRIVER.format(script=str(SCRIPT), common=common, first=["--until-round", "1"])
    done = subprocess.run(
        [sys.executable, "-c", driver], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["heavy"] == []  # flcore alone: no Ray, MLflow or Optuna imported

    first, second, third = (d["runs"][0] for d in result["docs"])
    assert first["run"] == "hetero-local-tiny-r2-s0"  # its round count in its name
    assert (first["rounds"], first["rounds_done"], first["ended"]) == (2, 1, False)
    assert (second["rounds_done"], second["ended"]) == (2, True)
    assert second["comparable"] is False and second["paper"] == 74.98  # shown, not compared
    assert 0 <= second["accuracy"] <= 100 and second["accuracy_worst_width"] <= 100
    assert second["best_round"] in (1, 2) and second["ours_metric"] == "accuracy"
    assert third == second  # an ended run is only read back (its seconds too)
    assert first["all_clients"] is None  # not ended: nothing measured on every client
    # the ended run, measured on every client at its best window's last round
    assert 0 <= second["all_clients"] <= 100 and second["all_clients_round"] == second["best_round"]
    assert second["all_clients_worst_width"] <= second["all_clients"]

    run_dir = out / "hetero-local-tiny-r2-s0"
    rounds = [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").open()]
    assert rounds == [1, 2]  # round 1 ran once; the resumed run went on with round 2
    assert json.loads((run_dir / "summary.json").read_text())["rounds_completed"] == 2

    record = json.loads((tmp_path / "records" / "hetero-local-tiny-r2-s0.json").read_text())
    assert record["summary"] == json.loads((run_dir / "summary.json").read_text())
    assert record["config"]["capacity"]["name"] == "uniform" and record["config"]["rounds"] == 2
    # how often it measured the global model: in its config, not one of the variant's --set
    assert record["config"]["global_eval_every"] == 5
    assert not any("global_eval_every" in o for o in second["overrides"])
    assert [row[0] for row in record["curve"]["rows"]] == [1, 2]
    every = json.loads((run_dir / "all_clients.json").read_text())
    assert every["clients"] == 4 and every["state"] == "best.pt"
    assert record["all_clients"]["accuracy"] == pytest.approx(every["accuracy"], rel=1e-5)

    def summary(out_dir: Path) -> str:
        return subprocess.run(
            [sys.executable, str(SCRIPT), "--summary", "--out", str(out_dir),
             "--records", str(tmp_path / "records")],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    # a file in the folder that is not a run's record is passed over
    (tmp_path / "records" / "notes.json").write_text('{"runs": {}}')
    table = summary(out)
    row = next(line for line in table.splitlines() if line.startswith("| local (tiny)"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["hetero", "2 (ran 2)", "1"]
    assert cells[4] == f"{second['accuracy']:.2f} (accuracy)"
    assert cells[5] == "74.98" and cells[6] == "n/a (not the paper's setting)"
    assert cells[8] == f"{second['all_clients']:.2f} ({second['all_clients_worst_width']:.2f})"
    # with the run folder gone (a new machine), its record gives the same table
    assert summary(tmp_path / "elsewhere") == table


def test_the_summary_compares_only_ended_runs_of_the_papers_setting() -> None:
    import runpy

    table = runpy.run_path(str(SCRIPT), run_name="reproduce")["summary_table"]

    def run(rounds_done: int, label: str = "", early: float = 0.0) -> dict:
        summary = {"rounds": rounds_done, "early_stopped": early, "accuracy": 0.9}
        return {"setting": "hetero", "method": "pa3dfl", "label": label, "rounds": 500,
                "seed": 0, "summary": summary}  # fmt: skip

    assert "n/a (run not ended)" in table([run(114)])
    diverged = run(6)
    diverged["summary"]["diverged_round"] = 6  # a NaN loss ended it (benchmarks/_runs.py)
    assert "n/a (diverged: NaN loss at round 6" in table([diverged])
    assert "+0.45" in table([run(500)])  # 90.00 against the paper's 89.55
    assert "+0.45" in table([run(230, early=1.0)])  # ended by early stopping
    assert "n/a (not the paper's setting) |" in table([run(500, label="clip10")])
    # a labelled variant under way says so too
    assert "n/a (not the paper's setting; run not ended)" in table([run(114, label="clip10")])
    # Table 3's ablations are compared with Table 3's figures (Hetero only)
    ablated = table([run(500, label="flanc-dec")])
    assert "| pa3dfl (flanc-dec) |" in ablated and "84.58" in ablated and "+5.42" in ablated
    assert "78.94" in table([run(500, label="no-hn")])
    ideal = dict(run(500, label="no-hn"), setting="ideal")
    assert "| - | -" in table([ideal])  # no Ideal figure in Table 3's FMNIST column


def _write_log(folder: Path, rounds: int, val: float, accuracy: float) -> None:
    """A run folder's ``metrics.jsonl``: rounds 1..rounds at constant accuracies."""
    row = {"val_accuracy": val, "accuracy": accuracy}
    (folder / "metrics.jsonl").write_text(
        "".join(json.dumps({"round": r} | row) + "\n" for r in range(1, rounds + 1))
    )


def _pa3dfl_cells(mod: dict, runs: list[dict]) -> list[str]:
    """The cells of the summary table's plain ``pa3dfl`` row."""
    row = next(line for line in mod["summary_table"](runs).splitlines() if "| pa3dfl |" in line)
    return [c.strip() for c in row.strip("|").split("|")]


def test_a_run_under_way_is_read_from_its_log_not_its_last_chunks_summary(
    tmp_path: Path,
) -> None:
    import runpy

    mod = runpy.run_path(str(SCRIPT), run_name="reproduce")
    # the summary.json a stopped chunk wrote at round 11; the resumed run has logged to 103
    summary = {"rounds": 11, "early_stopped": 0.0, "accuracy": 0.70, "best_round": 11,
               "best_window_start": 2, "best_val_accuracy": 0.72,
               "accuracy_worst_width": 0.70, "accuracy_width_0.5": 0.70}  # fmt: skip
    _write_log(tmp_path, 103, val=0.85, accuracy=0.86)
    run = {"setting": "hetero", "method": "pa3dfl", "label": "", "rounds": 500, "seed": 0,
           "summary": summary, "folder": str(tmp_path)}  # fmt: skip
    cells = _pa3dfl_cells(mod, [run])
    assert cells[2] == "500 (ran 103)"  # the log's last round, not the summary's 11
    assert cells[4] == "86.00 (accuracy)"  # rescored from the log
    assert cells[6] == "n/a (run not ended)"
    assert cells[7] == "-"  # the stale summary's worst width (70.00) is not shown
    assert mod["width_table"]([run]) == ""  # nor its per-width figures
    # once the summary covers the log (the chunk ended), both come back
    summary["rounds"] = 103
    cells = _pa3dfl_cells(mod, [run])
    assert cells[2] == "500 (ran 103)" and cells[7] == "70.00"
    assert "| 0.5 | 70.00 |" in mod["width_table"]([run])


def test_a_seed_under_way_is_named_beside_the_ended_seeds_not_averaged_in(
    tmp_path: Path,
) -> None:
    import runpy

    mod = runpy.run_path(str(SCRIPT), run_name="reproduce")
    # seed 0 ended (early stop at 363) at 90.00; seed 1's resumed run has logged 28 rounds at
    # 80.00, and its last chunk's summary covers them and follows the rule
    ended = {"rounds": 363, "early_stopped": 1.0, "accuracy": 0.90, "best_round": 262,
             "best_window_start": 253, "best_val_accuracy": 0.91,
             "accuracy_worst_width": 0.78, "accuracy_width_0.5": 0.88}  # fmt: skip
    chunk = {"rounds": 28, "early_stopped": 0.0, "accuracy": 0.80, "best_round": 28,
             "best_window_start": 19, "best_val_accuracy": 0.81,
             "accuracy_worst_width": 0.60, "accuracy_width_0.5": 0.62}  # fmt: skip
    _write_log(tmp_path, 28, val=0.81, accuracy=0.80)
    base = {"setting": "hetero", "method": "pa3dfl", "label": "", "rounds": 500}
    runs = [
        base | {"seed": 0, "summary": ended, "folder": None, "record": {}},
        base | {"seed": 1, "summary": chunk, "folder": str(tmp_path)},
    ]
    cells = _pa3dfl_cells(mod, runs)
    assert cells[2:8] == [
        "500 (ran 28, 363)",
        "1 (+1 under way)",
        "90.00 (accuracy); under way: seed 1 80.00 so far, round 28",
        "89.55",
        "+0.45",  # seed 0's alone: a mean with seed 1's 80.00 would read 85.00
        "78.00",  # nor seed 1's worst width
    ]
    assert "| 0.5 | 88.00 |" in mod["width_table"](runs)  # its clusters neither
    assert "1 seed)" in mod["width_table"](runs)
    # once seed 1 ends, both seeds count
    chunk |= {"rounds": 500}
    cells = _pa3dfl_cells(mod, runs)
    assert cells[3:6] == ["2", "85.00 ± 7.07 (accuracy)", "89.55"]
    assert "| 0.5 | 75.00 ± 18.38 |" in mod["width_table"](runs)


def test_a_run_in_its_first_chunk_is_listed_as_under_way(tmp_path: Path) -> None:
    import runpy

    mod = runpy.run_path(str(SCRIPT), run_name="reproduce")
    folder = tmp_path / "hetero-pa3dfl-no-hn-r500-s0"  # no summary.json: never stopped yet
    folder.mkdir()
    _write_log(folder, 30, val=0.78, accuracy=0.77)
    (tmp_path / "ideal-fedavg-r500-s0").mkdir()  # neither file: not a run
    runs = mod["read_runs"](tmp_path, None)
    assert [(r["method"], r["label"], r["summary"]) for r in runs] == [("pa3dfl", "no-hn", {})]
    row = next(line for line in mod["summary_table"](runs).splitlines() if "no-hn" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:8] == [
        "500 (ran 30)",
        "1",
        "77.00 (accuracy)",  # rescored from its log
        "78.94",  # Table 3's figure
        "n/a (run not ended)",
        "-",  # no worst width without a summary
    ]
    assert mod["width_table"](runs) == "" and mod["paired_table"](runs) == ""


def test_the_figure_draws_each_runs_trailing_window_and_the_papers_dot(tmp_path: Path) -> None:
    import runpy

    import matplotlib

    matplotlib.use("Agg")
    mod = runpy.run_path(str(SCRIPT), run_name="reproduce")
    assert mod["trailing_means"]([{"round": r, "a": r / 10} for r in (1, 2, 3, 4)], "a", 2) == [
        (1, 0.1),
        (2, 0.15),
        (3, 0.25),
        (4, 0.35),
    ]

    def run(method: str, seed: int, value: float, label: str = "", rounds: int = 500) -> dict:
        folder = tmp_path / f"{method}{label}{seed}"
        folder.mkdir()
        key = mod["OURS_METRIC"][method]
        (folder / "metrics.jsonl").write_text(
            "".join(json.dumps({"round": r, key: value + r / 1000}) + "\n" for r in (1, 2, 3))
        )
        return {"setting": "hetero", "method": method, "label": label, "rounds": rounds,
                "seed": seed, "summary": {"rounds": 3}, "folder": str(folder)}  # fmt: skip

    runs = [run("pa3dfl", 1, 0.5), run("pa3dfl", 0, 0.8), run("fedavg", 0, 0.7),
            run("ditto", 0, 0.6, rounds=200), run("pa3dfl", 0, 0.9, label="hnlr1"),
            run("pa3dfl", 0, 0.75, label="no-hn")]  # fmt: skip
    assert mod["draw_setting"](runs, "ideal") is None  # no Ideal run
    fig = mod["draw_setting"](runs, "hetero")
    lines = {line.get_label(): line for line in fig.axes[0].lines}
    curves = {k: v for k, v in lines.items() if not k.startswith("_")}
    assert list(curves) == [  # METHODS' order; each (method, label, rounds)'s lowest seed
        "fedavg, r500, seed 0",
        "ditto, r200, seed 0",
        "pa3dfl, r500, seed 0",
        "pa3dfl (hnlr1), r500, seed 0",
        "pa3dfl (no-hn), r500, seed 0",
    ]
    pa3dfl = curves["pa3dfl, r500, seed 0"]
    assert list(pa3dfl.get_xdata()) == [1, 2, 3]
    # the 10-round trailing mean in percent: 80.1, mean(80.1, 80.2), mean(80.1..80.3)
    assert list(pa3dfl.get_ydata()) == pytest.approx([80.1, 80.15, 80.2])
    assert pa3dfl.get_linestyle() == "-" and curves["ditto, r200, seed 0"].get_linestyle() == "--"
    assert curves["pa3dfl (hnlr1), r500, seed 0"].get_linestyle() == ":"
    # an ablation is Pa3dFL's colour, so its own style: not Pa3dFL's solid line
    assert curves["pa3dfl (no-hn), r500, seed 0"].get_linestyle() == "-."
    dots = [
        (list(v.get_xdata()), list(v.get_ydata())) for k, v in lines.items() if k.startswith("_")
    ]
    # Table 1's Hetero cells of FedAvg, Ditto and Pa3dFL, Table 3's for the ablation; none for
    # the labelled variant
    assert sorted(dots) == sorted(
        [([500], [87.76]), ([500], [86.51]), ([500], [89.55]), ([500], [78.94])]
    )
    written = mod["plot_curves"](runs, tmp_path / "plots")
    assert written == [str(tmp_path / "plots" / "table1-hetero.png")]
    assert Path(written[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_method_has_a_colour_of_its_own() -> None:
    import itertools
    import math
    import runpy

    from matplotlib.colors import to_rgb

    mod = runpy.run_path(str(SCRIPT), run_name="reproduce")
    colours = [to_rgb(mod["COLOURS"][i]) for i in range(len(mod["METHODS"]))]
    # RGB distance: tab10's closest pair (brown and grey) is 0.26 apart; two greys 0.6 and C7
    # (the palette before) were 0.18
    assert min(math.dist(a, b) for a, b in itertools.combinations(colours, 2)) > 0.2


def test_plot_needs_summary(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--plot", str(tmp_path / "p"), "--out", str(tmp_path)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and "--plot draws the --summary's runs" in done.stderr
    assert not (tmp_path / "p").exists() and list(tmp_path.iterdir()) == []


def test_ablation_sets_its_override_and_refuses_other_methods(tmp_path: Path) -> None:
    import runpy

    mod = runpy.run_path(str(SCRIPT), run_name="reproduce")
    assert mod["is_comparable"](500, "flanc-dec", ["algorithm_params.decomposition=flanc"])
    assert not mod["is_comparable"](200, "flanc-dec", ["algorithm_params.decomposition=flanc"])
    assert not mod["is_comparable"](500, "flanc-dec", ["algorithm_params.decomposition=channel"])
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--ablation", "no-hn", "--methods", "fedavg",
         "--out", str(tmp_path / "o")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and "--ablation runs Pa3dFL alone" in done.stderr
    assert not (tmp_path / "o").exists()


def test_a_run_that_ended_elsewhere_is_read_from_its_record_not_run_again(
    tmp_path: Path,
) -> None:
    """A new machine has the committed records but no run folders: a run with a record is
    reported from it (the queue, benchmarks/pa3dfl_queue.sh, relies on this) and nothing runs."""
    import shutil

    committed = SCRIPT.parent / "records" / "pa3dfl" / "hetero-fedavg-r500-s0.json"
    records = tmp_path / "records"
    records.mkdir()
    shutil.copy(committed, records / committed.name)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--methods", "fedavg", "--settings", "hetero",
         "--seeds", "0", "--workers", "1", "--until-round", "1", "--out", str(out),
         "--records", str(records)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ended before" in done.stderr and "not run again" in done.stderr
    assert not out.exists()  # nothing ran, nothing written
    (run,) = json.loads(done.stdout)["runs"]
    record = json.loads(committed.read_text())
    assert run["from_record"] == str(records / committed.name) and run["ended"] is True
    assert run["rounds"] == 500 and run["comparable"] is True and run["paper"] == 87.76
    assert run["rounds_done"] == record["summary"]["rounds_completed"]
    assert run["best_round"] == record["summary"]["best_round"]
    assert run["accuracy_before"] == round(100 * record["summary"]["accuracy_before"], 2)
    assert run["all_clients"] == round(100 * record["all_clients"]["accuracy_before"], 2)
    assert (records / committed.name).read_bytes() == committed.read_bytes()  # left as it was


def test_every_config_stops_on_its_deployed_models_validation_over_the_window() -> None:
    import runpy

    import yaml

    mod = runpy.run_path(str(SCRIPT), run_name="reproduce")
    for setting in mod["SETTINGS"]:
        for method in mod["METHODS"]:
            raw = yaml.safe_load(mod["config_path"](setting, method).read_text())
            stopping = raw["early_stopping"]
            assert stopping["metric"] == mod["SELECT_METRIC"][method], (setting, method)
            assert stopping["window"] == mod["WINDOW"] == 10, (setting, method)


def test_the_summary_rescores_every_run_by_the_window_rule_from_its_curve() -> None:
    import runpy

    mod = runpy.run_path(str(SCRIPT), run_name="reproduce")
    rescore, table = mod["rescore"], mod["summary_table"]
    # validation climbs to a lucky single round (12), then holds a higher plateau (20-29)
    val = [0.5 + 0.01 * r for r in range(1, 11)] + [0.6, 0.9] + [0.6] * 7 + [0.8] * 10
    curve = [
        {"round": r, "val_accuracy": v, "accuracy": v - 0.05, "val_accuracy_before": 0.1}
        for r, v in enumerate(val, start=1)
    ]
    value, start, end = rescore(curve, "pa3dfl")
    assert (start, end) == (20, 29) and value == pytest.approx(0.75)
    # a run whose own summary chose round 12 alone is judged by the rule all the same, and
    # its worst-width cell (chosen by the old rule) is left out
    record = {"curve": {"columns": list(curve[0]), "rows": [list(r.values()) for r in curve]}}
    summary = {"rounds": 29, "early_stopped": 0.0, "accuracy": 0.85, "best_round": 12,
               "best_val_accuracy": 0.9, "accuracy_worst_width": 0.7}  # fmt: skip
    run = {"setting": "hetero", "method": "pa3dfl", "label": "", "rounds": 29, "seed": 0,
           "summary": summary, "folder": None, "record": record}  # fmt: skip
    row = next(line for line in table([run]).splitlines() if line.startswith("| pa3dfl"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == "75.00 (accuracy)" and cells[7] == "-"
    # the same run under the rule keeps its own worst-width cell
    summary |= {"best_round": 29, "best_window_start": 20, "best_val_accuracy": 0.8}
    row = next(line for line in table([run]).splitlines() if line.startswith("| pa3dfl"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[7] == "70.00" and cells[8] == "-"  # no all-client evaluation in the record
    # a record with its all-client evaluation shows it, worst cluster in brackets
    record["all_clients"] = {"accuracy": 0.8123, "accuracy_worst_width": 0.61}
    row = next(line for line in table([run]).splitlines() if line.startswith("| pa3dfl"))
    assert row.strip("|").split("|")[8].strip() == "81.23 (61.00)"
    # a global-model method is chosen on the validation accuracy of the model it deploys
    assert rescore(curve, "fedavg") is None  # no accuracy_before logged in this curve


def test_the_width_table_shows_each_cluster_of_runs_under_the_rule() -> None:
    import runpy

    width_table = runpy.run_path(str(SCRIPT), run_name="reproduce")["width_table"]

    def run(method: str, seed: int, widths: dict[str, float], rule: bool = True) -> dict:
        metric = "accuracy_before" if method == "fedavg" else "accuracy"
        summary = {f"{metric}_width_{w}": v for w, v in widths.items()}
        summary[f"{metric}_worst_width"] = min(widths.values())
        if method == "fedavg":  # after local training: not the model FedAvg deploys
            summary["accuracy_width_9"] = 0.1
        if rule:
            select = "val_accuracy_before" if method == "fedavg" else "val_accuracy"
            summary |= {f"best_{select}": 0.9, "best_round": 30, "best_window_start": 21}
        return {"setting": "hetero", "method": method, "label": "", "rounds": 500,
                "seed": seed, "summary": summary}  # fmt: skip

    runs = [
        run("fedavg", 0, {"0.125": 0.90, "0.5": 0.91}),
        run("fedavg", 1, {"0.0625": 0.80, "0.5": 0.93}),
        run("pa3dfl", 0, {"0.125": 0.78, "0.5": 0.89}),
        run("pa3dfl", 1, {"0.125": 0.10}, rule=False),  # chosen by the old rule: left out
    ]
    lines = width_table(runs).splitlines()

    assert lines[0] == "| width (hetero) | fedavg (r500, 2 seeds) | pa3dfl (r500, 1 seed) |"
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    rows = {c[0]: c[1:] for c in cells}
    assert rows["0.0625"] == ["80.00", "-"]
    assert rows["0.125"] == ["90.00", "78.00"]
    assert rows["0.5"][0].startswith("92.00") and rows["0.5"][1] == "89.00"  # seeds' mean
    assert "9" not in rows  # FedAvg deploys the received model: after training is not read
    assert width_table([r for r in runs if r["setting"] == "ideal"]) == ""
    # every client on the best state: the clusters of the runs' all-client evaluations
    assert width_table(runs, every_client=True) == ""  # none has one
    runs[2]["record"] = {"all_clients": {"accuracy_width_0.125": 0.7, "accuracy_width_0.5": 0.88}}
    runs[3]["record"] = {"all_clients": {"accuracy_width_0.125": 0.6}}  # any rule: one state
    lines = width_table(runs, every_client=True).splitlines()
    assert lines[0] == "| width (hetero) | pa3dfl (r500, 2 seeds) |"
    rows = {
        c[0]: c[1:] for c in ([x.strip() for x in ln.strip("|").split("|")] for ln in lines[2:])
    }
    assert rows["0.125"][0].startswith("65.00 ±") and rows["0.5"] == ["88.00"]


def test_the_paired_table_compares_clients_of_the_same_draw() -> None:
    import runpy

    paired_table = runpy.run_path(str(SCRIPT), run_name="reproduce")["paired_table"]

    def run(method: str, seed: int, accs: list[float], widths: list[float], **kw: str) -> dict:
        metric = "accuracy_before" if method == "fedavg" else "accuracy"
        rows = [
            {"client": c, "width": w, metric: a, "accuracy" if metric != "accuracy"
             else "accuracy_before": 0.0}
            for c, (a, w) in enumerate(zip(accs, widths, strict=True))
        ]  # fmt: skip
        return {"setting": "hetero", "method": method, "label": kw.get("label", ""),
                "rounds": 500, "seed": seed, "summary": {},
                "record": {"all_clients": {"per_client": rows}}}  # fmt: skip

    widths = [0.125, 0.5, 0.5, 1.0, 1.0, 1.0]
    pa = [0.80, 0.90, 0.95, 0.90, 0.85, 0.90]
    fa = [0.90, 0.90, 0.85, 0.95, 0.95, 0.95]  # Pa3dFL: 1 ahead, 1 level, 4 behind
    runs = [
        run("pa3dfl", 0, pa, widths),
        run("fedavg", 0, fa, widths),
        run("fedavg", 1, fa, widths),  # another seed: no pair
        run("fjord", 0, fa, [1.0] * 6),  # another capacity draw: no pair
        run("pa3dfl", 0, fa, widths, label="no-hn"),  # an ablation pairs with Pa3dFL
    ]
    lines = paired_table(runs).splitlines()
    assert len(lines) == 4
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    fedavg, ablation = cells
    assert fedavg[:5] == ["hetero", "0", "pa3dfl (r500)", "fedavg (r500)", "6"]
    diffs = [100 * (a - b) for a, b in zip(pa, fa, strict=True)]
    assert fedavg[5] == f"{sum(diffs) / 6:+.2f}" == "-3.33"
    assert fedavg[6] == "1 / 1 / 4"
    # sign test: 1 of 5 non-zero differences ahead, two-sided: 2 x 6/32
    assert float(fedavg[7]) == pytest.approx(0.375, abs=1e-3)
    from scipy.stats import wilcoxon

    assert float(fedavg[8]) == pytest.approx(wilcoxon(diffs).pvalue, rel=1e-2)
    assert ablation[3] == "pa3dfl (no-hn) (r500)" and ablation[6] == "1 / 1 / 4"
    # a record keeps 6 digits of each accuracy, a run folder full floats: the same table
    noisy = [run("pa3dfl", 0, [a + 3e-7 for a in pa], widths), *runs[1:]]
    assert paired_table(noisy) == "\n".join(lines)
    # no run measured on every client, or only the anchor: nothing to pair
    assert paired_table([runs[0]]) == ""
    assert paired_table([r | {"record": {}} for r in runs]) == ""


def test_the_ordering_is_judged_on_ended_500_round_seeds_only() -> None:
    import runpy

    claims = runpy.run_path(str(SCRIPT), run_name="reproduce")["ordering_claims"]

    def run(method: str, seed: int, value: float, rounds: int = 500, done: int = 500,
            label: str = "") -> dict:  # fmt: skip
        metric = "accuracy_before" if method in ("fedavg", "heterofl", "flanc") else "accuracy"
        summary = {"rounds": done, "early_stopped": 0.0, metric: value}
        return {"setting": "hetero", "method": method, "label": label, "rounds": rounds,
                "seed": seed, "summary": summary, "folder": None, "record": {}}  # fmt: skip

    runs = [run("pa3dfl", s, 0.90 + 0.001 * s) for s in range(3)]
    runs += [run("fedavg", s, 0.88 + 0.001 * s) for s in range(3)]
    runs += [run("heterofl", 0, 0.95, rounds=200, done=117, label="sbn")]
    lines = claims(runs)
    assert lines[0].startswith("1. hetero: pa3dfl above fedavg (paper 89.55 > 87.76")
    assert lines[0].endswith("supported [+2.00 (3/3 seeds), supported]")
    # a 200-round run is no evidence for the 500-round cell, whatever it scored
    assert "heterofl has r200 sbn runs only" in lines[1] and "not measured [-]" in lines[1]
    # a seed under way (round 120 of 500) does not count: two ended seeds decide nothing
    runs[2] = run("pa3dfl", 2, 0.70, done=120)
    assert "inconclusive [+1.95 (2/3 seeds), inconclusive]" in claims(runs)[0]
    # the other way round: FedAvg ahead on every seed, beyond the noise
    flipped = [run("pa3dfl", s, 0.86 + 0.001 * s) for s in range(3)] + runs[3:6]
    assert "NOT supported [-2.00 (3/3 seeds), NOT supported]" in claims(flipped)[0]


def test_a_run_another_process_holds_is_left_to_it(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    import runpy

    sys.path.insert(0, str(SCRIPT.parent))
    from _runs import run_lock

    mod = runpy.run_path(str(SCRIPT), run_name="reproduce")
    out = tmp_path / "o"
    argv = ["--methods", "pa3dfl", "--settings", "hetero", "--seeds", "0", "--rounds", "2",
            "--out", str(out), "--records", ""]  # fmt: skip
    with run_lock(out / "hetero-pa3dfl-r2-s0"), pytest.raises(SystemExit, match="1 run"):
        mod["main"](argv)
    captured = capsys.readouterr()
    assert json.loads(captured.out)["runs"] == []
    assert "skipped:" in captured.err and "being run by another process" in captured.err
    assert [p.name for p in (out / "hetero-pa3dfl-r2-s0").iterdir()] == ["run.lock"]
