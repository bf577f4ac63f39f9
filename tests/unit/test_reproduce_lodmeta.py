"""benchmarks/reproduce_lodmeta.py: a tiny real-FMNIST walk runs, stops, resumes and ends; the
summary reads the run folders (curves included), decides the claims only on enough seeds, and
needs no Ray, MLflow or Optuna."""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "reproduce_lodmeta.py"


def _mod() -> dict:  # type: ignore[type-arg]
    return runpy.run_path(str(SCRIPT), run_name="reproduce")


def _write_run(
    out: Path,
    name: str,
    curve: list[tuple[float, float, float]],
    model_bytes: float = 100.0,
    steps: int = 2000,
) -> None:
    """A run folder whose log is ``curve`` (its evaluated rounds) and whose summary says
    ``steps`` steps were done (the configs' 2,000: an ended run)."""
    folder = out / name
    folder.mkdir(parents=True)
    # bytes up and down: each unit of communication moves one model (half of it each way)
    rows = [
        {"round": i + 1, "comm_units": u, "accuracy": a, "unseen_accuracy": b}
        | {"bytes_up": u * model_bytes / 2, "bytes_down": u * model_bytes / 2}
        for i, (u, a, b) in enumerate(curve)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    last = rows[-1]
    summary = {"accuracy": last["accuracy"], "unseen_accuracy": last["unseen_accuracy"]}
    summary |= {"comm_units": last["comm_units"], "rounds": steps}
    (folder / "summary.json").write_text(json.dumps(summary))


def _tiny(data_root: Path, *extra: str) -> list[str]:
    """``--set`` options for a tiny walk on the test's FMNIST (4 clients, 4 channels)."""
    overrides = [f"data_root={data_root}", "num_clients=4", "model_params.hidden=4", *extra]
    return [arg for over in overrides for arg in ("--set", over)]


def _main_runs(mod: dict, args: list[str]) -> list[dict]:  # type: ignore[type-arg]
    """The script's ``main(args)``: the records of its JSON output."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        mod["main"](args)
    return json.loads(buf.getvalue())["runs"]  # type: ignore[no-any-return]


def test_cost_to_reach_and_the_communication_claim(tmp_path: Path) -> None:
    mod = _mod()
    curve = [(1, 0.5, None, 10.0), (2, 0.8, None, 20.0), (3, 0.9, None, 30.0)]
    assert mod["cost_to_reach"](curve, 0.8) == 2 and mod["cost_to_reach"](curve, 0.8, 3) == 20.0
    assert mod["cost_to_reach"](curve[:1], 0.8) is None
    # three seeds where LoDMeta reaches 95% of its final accuracy at 1/3 of basic's units
    for seed in range(3):
        _write_run(tmp_path, f"regular-5shot-lodmeta-s{seed}", [(10, 0.8, 0.7), (20, 0.9, 0.8)])
        _write_run(
            tmp_path,
            f"regular-5shot-lodmeta_basic-s{seed}",
            [(30, 0.8, 0.7), (60, 0.9, 0.8)],
        )
    runs = mod["read_runs"](tmp_path)
    assert len(runs) == 6 and all(r["curve"] for r in runs)
    claims = mod["claims"](runs)
    # each reached the target between its two evaluations: LoDMeta in (10, 20], basic in
    # (30, 60], so the ratio lies in (10/60, 20/30), and 0.5 is inside: not decided
    assert claims[1].startswith("2.") and (
        "lodmeta_basic: LoDMeta's cost / lodmeta_basic's = 0.33 where both reached it (3 seeds, "
        "in bytes 0.333), between 0.17 and 0.67 at the evaluations (3 seeds), inconclusive"
        in claims[1]
    )
    assert "not measured" in claims[1]  # L2C has no run
    # an L2C whose Table 1 units understate its bytes 100-fold (every client gossips a round)
    for seed in range(3):
        _write_run(
            tmp_path, f"regular-5shot-l2c-s{seed}", [(30, 0.8, 0.7), (60, 0.9, 0.8)], 10_000.0
        )
    claims = mod["claims"](mod["read_runs"](tmp_path))
    assert (
        "l2c: LoDMeta's cost / l2c's = 0.33 where both reached it (3 seeds, in bytes 0.003), "
        "between 0.17 and 0.67 at the evaluations (3 seeds), inconclusive" in claims[1]
    )
    assert claims[2].split(":")[1].strip().startswith("supported")  # 90 > 80 on 3 seeds
    # --early runs (the same runs' first units, evaluated densely) narrow the brackets: LoDMeta
    # in (3, 4], basic in (9, 12]: the ratio lies in (0.25, 0.44), below 0.5 on every seed
    for seed in range(3):
        _write_run(
            tmp_path,
            f"regular-5shot-lodmeta-early-s{seed}",
            [(3, 0.5, 0.7), (4, 0.86, 0.7), (10, 0.8, 0.7)],
            steps=10,
        )
        _write_run(
            tmp_path,
            f"regular-5shot-lodmeta_basic-early-s{seed}",
            [(9, 0.5, 0.7), (12, 0.86, 0.7), (30, 0.8, 0.7)],
            steps=10,
        )
    claims = mod["claims"](mod["read_runs"](tmp_path))
    assert (
        "lodmeta_basic: LoDMeta's cost / lodmeta_basic's = 0.33 where both reached it (3 seeds, "
        "in bytes 0.333), between 0.25 and 0.44 at the evaluations (3 seeds), supported"
        in claims[1]
    )
    # an early run that is not its full run's first steps is refused, not merged
    bad = tmp_path / "regular-5shot-lodmeta_basic-early-s2"
    shutil.rmtree(bad)
    _write_run(tmp_path, bad.name, [(12, 0.86, 0.7), (30, 0.7, 0.7)], steps=10)
    with pytest.raises(ValueError, match="not its full run's first steps: accuracy 0.700000"):
        mod["claims"](mod["read_runs"](tmp_path))


def test_the_claims_wait_for_runs_under_way(tmp_path: Path) -> None:
    """A run stopped on its way (``--until-round``, ``--max-minutes``) has a summary of its
    steps so far: the claims leave it out, except that claim 2 takes what it shows: the
    communication at which it reached LoDMeta's target, or, not yet reached, a bound (its cost
    is beyond its last evaluation), as a run that ended without reaching it gives."""
    mod = _mod()
    for seed in range(3):
        _write_run(tmp_path, f"regular-5shot-lodmeta-s{seed}", [(10, 0.8, 0.7), (20, 0.9, 0.8)])
        _write_run(tmp_path, f"regular-5shot-lodmeta_basic-s{seed}", [(30, 0.9, 0.8)])
        _write_run(tmp_path, f"regular-5shot-lodmeta_sgd-s{seed}", [(10, 0.5, 0.7)], steps=100)
    # L2C under way: seed 0 reached 95% of LoDMeta's 0.9 at 60 units, seeds 1-2 not yet
    _write_run(tmp_path, "regular-5shot-l2c-s0", [(30, 0.8, 0.7), (60, 0.9, 0.8)], steps=20)
    for seed in (1, 2):
        _write_run(tmp_path, f"regular-5shot-l2c-s{seed}", [(30, 0.8, 0.7)], steps=10)
    claims = mod["claims"](mod["read_runs"](tmp_path))
    # seed 0: (10/60, 20/30); seeds 1-2 beyond 30 units: (0, 20/30)
    l2c = (
        "l2c: LoDMeta's cost / l2c's = 0.33 where both reached it (1 seeds, in bytes 0.333), "
        "between 0.06 and 0.67 at the evaluations (3 seeds), inconclusive"
    )
    assert l2c in claims[1]
    # LoDMeta ~ basic decided; basic > SGD not: SGD has not done its steps on any seed
    assert claims[0].endswith("[+0.00 (3/3 seeds), supported; -]")
    assert "not measured" in claims[0]
    # ended without reaching it: the same bound (no made-up 0 for "never")
    for seed in (1, 2):
        summary = tmp_path / f"regular-5shot-l2c-s{seed}" / "summary.json"
        summary.write_text(json.dumps(json.loads(summary.read_text()) | {"rounds": 2000}))
    assert l2c in mod["claims"](mod["read_runs"](tmp_path))[1]
    # an --early run alone counts too (L2C's first rounds, where its whole run is too long)
    for seed in range(3):
        shutil.rmtree(tmp_path / f"regular-5shot-l2c-s{seed}")
        _write_run(tmp_path, f"regular-5shot-l2c-early-s{seed}", [(30, 0.8, 0.7)], steps=10)
    assert (
        "l2c: LoDMeta's cost / l2c's = between 0.00 and 0.67 at the evaluations (3 seeds), "
        "inconclusive" in mod["claims"](mod["read_runs"](tmp_path))[1]
    )


def test_a_tiny_walk_stops_resumes_and_needs_no_platform_layers(
    data_root: Path, tmp_path: Path
) -> None:
    mod = _mod()
    out = tmp_path / "out"
    common = ["--methods", "lodmeta", "--seeds", "0", "--rounds", "4", "--workers", "1"]
    records = tmp_path / "records"
    common += ["--out", str(out), "--checkpoint-every", "2", "--records", str(records)]
    for over in (
        f"data_root={data_root}",
        "num_clients=6",
        "fewshot.unseen_clients=2",
        "model_params.hidden=8",
        "algorithm_params.inner_steps=1",
        "eval_every=2",
    ):
        common += ["--set", over]
    common += ["--label", "tiny", "--global-eval-every", "3"]
    docs = []
    for extra in (["--until-round", "2"], []):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            mod["main"]([*common, *extra])
        docs.append(json.loads(buf.getvalue()))
    first, second = docs[0]["runs"][0], docs[1]["runs"][0]
    assert first["steps_done"] == 2 and not first["ended"]
    assert second["steps_done"] == 4 and second["ended"] and second["comm_units"] == 4.0
    run_dir = out / "regular-5shot-lodmeta-tiny-s0"
    assert (run_dir / "checkpoint.pt").is_file()

    # the ended run left its record (only once it ended); --summary reads it with the folder gone
    record = json.loads((records / "regular-5shot-lodmeta-tiny-s0.json").read_text())
    assert record["summary"] == json.loads((run_dir / "summary.json").read_text())
    assert record["config"]["rounds"] == 4 and record["config"]["model_params"]["hidden"] == 8
    assert record["config"]["global_eval_every"] == 3  # a walk's accuracy is not thinned:
    columns = record["curve"]["columns"]
    assert all(row[columns.index("accuracy")] is not None for row in record["curve"]["rows"][1::2])
    assert record["curve"]["columns"][0] == "round" and len(record["curve"]["rows"]) == 4
    from_folder = mod["read_runs"](out, records)
    shutil.rmtree(run_dir)
    from_record = mod["read_runs"](out, records)
    assert [r["folder"] for r in from_folder] == [run_dir] and from_record[0]["folder"] is None
    # the curve to the 6 significant digits a record keeps; the summary exactly
    assert from_record[0]["curve"] == [
        pytest.approx(point, rel=1e-5) for point in from_folder[0]["curve"]
    ]
    assert from_record[0]["curve"]
    assert from_record[0]["summary"] == from_folder[0]["summary"]
    assert mod["summary_table"](from_record) == mod["summary_table"](from_folder)


@pytest.mark.slow  # a benchmark script's or tuning's end-to-end run: `make slow`
def test_the_script_runs_on_flcore_alone(tmp_path: Path) -> None:
    # a fresh interpreter runs a 1-step walk through main(): Ray, MLflow and Optuna stay out
    code = (
        "import runpy, sys, contextlib, io; "
        f"mod = runpy.run_path({str(SCRIPT)!r}, run_name='reproduce'); "
        "buf = io.StringIO(); "
        f"out = {str(tmp_path)!r}; "
        "args = ['--methods', 'lodmeta_sgd', '--rounds', '1', '--workers', '1', '--out', out, "
        "'--records', out + '/records', '--set', 'num_clients=4', "
        "'--set', 'fewshot.unseen_clients=0', '--set', "
        "'model_params.hidden=4', '--set', 'algorithm_params.inner_steps=1', '--label', 'x']; "
        "ctx = contextlib.redirect_stdout(buf); ctx.__enter__(); mod['main'](args); "
        "ctx.__exit__(None, None, None); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'mlflow', 'optuna'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_table_reports_each_rows_weakest_epsilon() -> None:
    table = _mod()["summary_table"]

    def run(seed: int, epsilon: float | str) -> dict:
        summary = {"rounds": 10, "accuracy": 0.5, "epsilon": epsilon, "epsilon_accountant": 3.0}
        return {"setting": "regular-5shot", "method": "lodmeta", "label": "", "seed": seed,
                "summary": summary, "curve": [], "ended": True}  # fmt: skip

    row = table([run(0, 1.5), run(1, 2.5)]).splitlines()[2].split("|")
    assert [c.strip() for c in row[8:11]] == ["2.5", "3", "-"]  # the larger seed's epsilon
    row = table([run(0, 1.5), run(1, "inf")]).splitlines()[2].split("|")
    assert row[8].strip() == "inf"


def test_the_table_averages_ended_seeds_and_names_a_paused_one_beside_them(
    tmp_path: Path,
) -> None:
    mod = _mod()
    _write_run(tmp_path, "regular-5shot-lodmeta-s0", [(2000, 0.60, 0.70)])
    _write_run(tmp_path, "regular-5shot-lodmeta-s1", [(500, 0.30, 0.40)], steps=500)  # paused
    runs = mod["read_runs"](tmp_path)
    assert [r["ended"] for r in runs] == [True, False]
    row = mod["summary_table"](runs).splitlines()[2]
    assert row.startswith("| regular-5shot | lodmeta | 1 (+1 under way) | 2000 | 60.00; ")
    assert "under way: seed 1 at step 500 (30.00 so far)" in row


def test_a_full_length_run_is_the_configs_length() -> None:
    import yaml

    configs = sorted((SCRIPT.parents[1] / "sweeps" / "configs" / "lodmeta").glob("fmnist_*.yaml"))
    assert len(configs) == 6
    assert {yaml.safe_load(c.read_text())["rounds"] for c in configs} == {_mod()["STEPS"]}


def test_eps_and_delta_choose_the_grid_cells_that_run(data_root: Path, tmp_path: Path) -> None:
    mod = _mod()
    out, records = tmp_path / "out", tmp_path / "records"
    args = ["--grid", "--eps", "0.8", "0.5", "--delta", "1e-5"]
    args += ["--rounds", "1", "--workers", "1", "--out", str(out), "--records", str(records)]
    args += ["--label", "tiny"]
    args += _tiny(data_root, "fewshot.unseen_clients=0", "algorithm_params.inner_steps=1")
    runs = _main_runs(mod, args)
    # the two delta-1e-5 corners, in the grid's order, each with its own privacy overrides and
    # the variant's --set ones (its label after the cell's)
    assert [r["run"] for r in runs] == [
        "regular-5shot-lodmeta-eps0.5-d1e-05-tiny-s0",
        "regular-5shot-lodmeta-eps0.8-d1e-05-tiny-s0",
    ]
    assert "privacy.release_epsilon=0.5" in runs[0]["overrides"]
    assert "privacy.delta=1e-05" in runs[1]["overrides"]
    assert "privacy.clip=0.6" in runs[1]["overrides"]  # the configs' M, from measured norms
    assert "model_params.hidden=4" in runs[1]["overrides"]
    assert sorted(p.name for p in out.iterdir()) == [r["run"] for r in runs]
    record = json.loads((records / f"{runs[0]['run']}.json").read_text())
    assert record["config"]["model_params"]["hidden"] == 4
    assert record["config"]["privacy"]["release_epsilon"] == 0.5


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--grid", "--clip", "0.6", "--eps", "0.3"], "invalid choice: 0.3"),
        (["--delta", "1e-5"], "--eps and --delta choose cells of --grid"),
        (["--eps", "0.5", "0.6", "0.7", "0.8"], "--eps and --delta choose cells of --grid"),
        (["--ladder", "0.1", "--clip", "0"], "--clip must be > 0, got 0.0"),
        (["--ladder", "0", "--clip", "0.6"], "--ladder's noise multipliers must be > 0"),
        (["--ladder", "0.1", "--clip", "0.6", "--reference"], "not with --grid or --ladder"),
    ],
)
def test_grid_cells_and_ladder_rungs_outside_their_ranges_are_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    with pytest.raises(SystemExit):
        _mod()["main"]([*extra, "--out", str(tmp_path / "out")])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_summary_reads_the_committed_records_on_a_fresh_machine(tmp_path: Path) -> None:
    # no run folder yet (OUT does not exist): the table, the claims and the plots come from the
    # committed records, and the plots go into a newly made OUT
    records = SCRIPT.parent / "records" / "lodmeta"
    out = tmp_path / "never-made"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        _mod()["main"](["--summary", "--out", str(out), "--records", str(records)])
    printed = buf.getvalue()
    assert "| regular-5shot | lodmeta |" in printed
    assert (out / "accuracy_vs_communication-regular-5shot.png").stat().st_size > 1000


@pytest.mark.slow  # a benchmark script's or tuning's end-to-end run: `make slow`
def test_an_early_run_is_its_full_runs_first_steps(data_root: Path, tmp_path: Path) -> None:
    # the claim-2 merge rests on this: a walk's steps depend neither on its length nor on when
    # it is evaluated, so an early run (here 50 steps evaluated every 5, for time) and a longer
    # run evaluated every 25 agree exactly where both evaluated
    mod = _mod()
    out = tmp_path / "out"
    common = ["--methods", "lodmeta", "--seeds", "0", "--workers", "1", "--out", str(out)]
    common += ["--records", "", "--label", "tiny", "--checkpoint-every", "1000"]
    for over in (
        f"data_root={data_root}",
        "num_clients=4",
        "fewshot.unseen_clients=1",
        "model_params.hidden=4",
        "algorithm_params.inner_steps=1",
        "eval_every=25",
    ):
        common += ["--set", over]
    with contextlib.redirect_stdout(io.StringIO()):
        mod["main"]([*common, "--rounds", "60"])
        mod["main"]([*common, "--early", "--early-steps", "50", "--early-every", "5"])
    runs = mod["read_runs"](out)
    assert sorted(r["label"] for r in runs) == ["tiny", "tiny-early"]
    full = next(r for r in runs if r["label"] == "tiny")["curve"]
    early = next(r for r in runs if r["label"] == "tiny-early")["curve"]
    assert [p[0] for p in full] == [25, 50, 60]
    assert [p[0] for p in early] == [5 * i for i in range(1, 11)]
    assert early[4] == full[0] and early[9] == full[1]  # steps 25 and 50, to the bit
    merged = mod["merged_curve"](runs, "regular-5shot", "lodmeta", 0, "tiny")
    assert [p[0] for p in merged] == [*(p[0] for p in early), 60]
    with pytest.raises(SystemExit):  # --early reruns the configs' runs: no --rounds of its own
        mod["main"]([*common, "--early", "--rounds", "100"])


def test_the_figure_shows_early_only_runs_and_claim_2s_target(tmp_path: Path) -> None:
    # the figure a user reads claim 2 from: LoDMeta's whole run with its dense first steps,
    # L2C's first rounds alone (its whole run is ~17 h on a CPU), flagged as such, and the
    # target the claim measures the cost to reach
    mod = _mod()
    _write_run(tmp_path, "regular-5shot-lodmeta-s0", [(10, 0.8, 0.7), (20, 0.9, 0.8)])
    _write_run(
        tmp_path, "regular-5shot-lodmeta-early-s0", [(5, 0.6, 0.7), (10, 0.8, 0.7)], steps=10
    )
    _write_run(tmp_path, "regular-5shot-l2c-early-s0", [(3, 0.6, None), (6, 0.5, None)], steps=2)
    _write_run(tmp_path, "regular-5shot-lodmeta-eps0.5-d0.4-s0", [(20, 0.5, 0.5)])  # a grid cell
    runs = mod["read_runs"](tmp_path)
    seed, curves, target = mod["figure_curves"](runs, "regular-5shot")
    assert seed == 0 and list(curves) == ["lodmeta", "l2c"]
    lodmeta, only_early = curves["lodmeta"]
    assert [p[0] for p in lodmeta] == [5, 10, 20] and not only_early
    assert [p[0] for p in curves["l2c"][0]] == [3, 6] and curves["l2c"][1]
    assert target == pytest.approx(0.95 * 0.9)
    assert mod["figure_curves"](runs, "smallworld-5shot") is None
    # the paper's "MAML (1 client)" beside MAML: FedMAML's run at one client a round
    _write_run(tmp_path, "regular-5shot-fedmaml-s0", [(8, 0.7, 0.7), (16, 0.8, 0.8)])
    _write_run(tmp_path, "regular-5shot-fedmaml-1client-s0", [(2, 0.6, 0.7), (4, 0.7, 0.7)])
    runs = mod["read_runs"](tmp_path)
    curves = mod["figure_curves"](runs, "regular-5shot")[1]
    assert list(curves) == ["lodmeta", "fedmaml", "l2c", "fedmaml (1 client)"]
    assert [p[0] for p in curves["fedmaml (1 client)"][0]] == [2, 4]
    # one colour a method in both panels (L2C, with no unseen clients, only on the left)
    fig = mod["draw_curves"](curves, 0.8, "t")
    left = {ln.get_label(): ln.get_color() for ln in fig.axes[0].lines if ln.get_label()[0] != "9"}
    right = {ln.get_label(): ln.get_color() for ln in fig.axes[1].lines}
    assert (
        set(right) == {"lodmeta", "fedmaml", "fedmaml (1 client)"} and len(set(left.values())) == 4
    )
    assert all(right[k] == left[k] for k in right)
    written = mod["plot_curves"](runs, tmp_path / "plots")
    assert written == [str(tmp_path / "plots" / "accuracy_vs_communication-regular-5shot.png")]
    # without an ended LoDMeta run there is no target to draw
    (tmp_path / "regular-5shot-lodmeta-s0" / "summary.json").write_text(
        json.dumps({"accuracy": 0.9, "unseen_accuracy": 0.8, "comm_units": 20, "rounds": 100})
    )
    assert mod["figure_curves"](mod["read_runs"](tmp_path), "regular-5shot")[2] is None


def test_claim_4_counts_the_cells_that_beat_the_untrained_network(tmp_path: Path) -> None:
    # the grid's cells at the untrained network's level: a pair "falls", but nothing was learned
    # for it to fall from, and the claim says so (and stays inconclusive: one seed a cell)
    mod = _mod()
    out, records = tmp_path / "out", tmp_path / "records"
    _write_run(out, "regular-5shot-lodmeta-eps0.8-d0.4-s0", [(2000, 0.5601, 0.65)])
    _write_run(out, "regular-5shot-lodmeta-eps0.8-d1e-05-s0", [(2000, 0.5516, 0.65)])
    ref = {"setting": "regular-5shot", "seed": 0, "label": "", "accuracy": 59.59}
    file = mod["reference_file"](records, "regular-5shot", 0, "")
    file.parent.mkdir(parents=True)
    file.write_text(json.dumps(ref | {"unseen_accuracy": 77.91}))
    runs, references = mod["read_runs"](out, records), mod["read_references"](records)
    claim = mod["claims"](runs, references)[3]
    assert claim.startswith(
        "4. Tables 2-3: accuracy falls as epsilon or delta shrink: inconclusive"
    )
    assert (
        "1/1 smaller-epsilon-or-delta pairs lose accuracy (one seed); 0/2 cells above the "
        "untrained network adapted (59.59): no cell meta-learns, so there is no accuracy to fall"
    ) in claim
    assert "| regular-5shot | untrained network | 1 | 0 | 59.59 | 77.91 | 0 |" in mod[
        "summary_table"
    ](runs, references)
    # a cell more than a point above the reference learned something
    _write_run(out, "regular-5shot-lodmeta-eps0.8-d0.1-s0", [(2000, 0.7, 0.7)])
    claim = mod["claims"](mod["read_runs"](out, records), references)[3]
    assert claim.endswith("; 1/3 cells above the untrained network adapted (59.59), inconclusive]")
    # without a reference, only the pairs
    claim = mod["claims"](mod["read_runs"](out, records))[3]
    assert claim.endswith("lose accuracy (one seed), inconclusive]")


def test_the_reference_runs_nothing_else_and_leaves_its_record(
    data_root: Path, tmp_path: Path
) -> None:
    mod = _mod()
    out, records = tmp_path / "out", tmp_path / "records"
    args = ["--reference", "--seeds", "0", "--workers", "1", "--label", "tiny"]
    args += ["--out", str(out), "--records", str(records)]
    (rec,) = _main_runs(mod, args + _tiny(data_root, "fewshot.unseen_clients=2"))
    assert not out.exists() and not list(records.glob("*.json"))  # no run started
    saved = json.loads((records / "reference" / "regular-5shot-tiny-s0.json").read_text())
    assert saved["accuracy"] == rec["accuracy"] and 0 < rec["accuracy"] <= 100
    assert saved["unseen_accuracy"] is not None and saved["machine"]["cpus"] >= 1
    assert mod["read_references"](records) == {("regular-5shot", "tiny"): [saved]}
    with pytest.raises(SystemExit):
        mod["main"](["--reference", "--grid", "--clip", "0.6", "--out", str(out)])


def test_the_ladder_runs_its_noise_multipliers_labelled(data_root: Path, tmp_path: Path) -> None:
    mod = _mod()
    out = tmp_path / "out"
    args = ["--ladder", "0.5", "0.01", "--clip", "0.3", "--rounds", "1", "--workers", "1"]
    args += ["--out", str(out), "--records", "", "--label", "tiny"]
    runs = _main_runs(mod, args + _tiny(data_root, "fewshot.unseen_clients=0"))
    # an M other than the configs' is in the label: its runs never resume the default's
    assert [r["run"] for r in runs] == [
        "regular-5shot-lodmeta-z0.5-d1e-05-r1-M0.3-tiny-s0",
        "regular-5shot-lodmeta-z0.01-d1e-05-r1-M0.3-tiny-s0",
    ]
    assert "privacy.noise_multiplier=0.01" in runs[1]["overrides"]
    assert (
        "privacy.clip=0.3" in runs[1]["overrides"] and "privacy.delta=1e-05" in runs[1]["overrides"]
    )
    assert all(r["epsilon"] is not None and r["epsilon"] > 0 for r in runs)


def test_claim_4_reads_the_ladder_where_the_grid_is_flat(tmp_path: Path) -> None:
    mod = _mod()
    for z, acc in ((0.001, 0.90), (0.01, 0.77), (0.1, 0.64), (1.0, 0.60)):
        _write_run(
            tmp_path, f"regular-5shot-lodmeta-z{z:g}-d1e-05-r500-s0", [(500, acc, 0.7)], steps=500
        )
        summary = tmp_path / f"regular-5shot-lodmeta-z{z:g}-d1e-05-r500-s0" / "summary.json"
        summary.write_text(json.dumps(json.loads(summary.read_text()) | {"epsilon": 1.0 / z}))
    # a shorter rung does not mix with the 500-step ones
    _write_run(tmp_path, "regular-5shot-lodmeta-z0.5-d1e-05-r10-s0", [(10, 0.99, 0.7)], steps=10)
    part = mod["ladder_part"](mod["read_runs"](tmp_path), 59.59)
    assert part == (
        "inconclusive",
        "noise ladder (4 rungs, z 0.001 to 1, 500 steps): accuracy falls as z grows on 3/3 "
        "adjacent rungs, 3/4 above the untrained network adapted (the noisiest at z 0.1, "
        "epsilon 10)",
    )
    assert mod["ladder_part"]([], 59.59) is None


def test_the_grid_is_shown_in_the_papers_layout_and_nothing_is_filled_in(tmp_path: Path) -> None:
    mod = _mod()
    _write_run(tmp_path, "regular-5shot-lodmeta-eps0.8-d0.4-s0", [(2000, 0.5601, 0.6511)])
    _write_run(tmp_path, "regular-5shot-lodmeta-eps0.5-d1e-05-s0", [(2000, 0.5509, 0.6516)])
    _write_run(tmp_path, "regular-5shot-lodmeta-eps0.6-d0.1-s0", [(1000, 0.58, 0.7)], steps=1000)
    _write_run(tmp_path, "regular-5shot-lodmeta-eps0.7-d0.1-s1", [(2000, 0.9, 0.9)])  # seed 1
    for name, eps in (("eps0.8-d0.4", ("inf", 9.11, 7.51)), ("eps0.5-d1e-05", (3.15, 3.15, 6.74))):
        file = tmp_path / f"regular-5shot-lodmeta-{name}-s0" / "summary.json"
        keys = ("epsilon", "epsilon_accountant", "epsilon_paper")
        file.write_text(
            json.dumps(json.loads(file.read_text()) | dict(zip(keys, eps, strict=True)))
        )
    tables = mod["grid_tables"](mod["read_runs"](tmp_path))
    _, accuracy, epsilon = tables.split("Tables 2-3 grid")
    # rows from the largest epsilon down, columns from the largest delta, as in the paper
    assert "| epsilon \\ delta | 0.4 | 0.1 | 0.02 | 1e-05 |" in accuracy
    rows = [line for line in accuracy.splitlines() if line.startswith("| 0.")]
    assert [r.split(" | ")[0] for r in rows] == ["| 0.8", "| 0.7", "| 0.6", "| 0.5"]
    assert "| 0.8 | 56.01 / 65.11 | - | - | - |" in accuracy
    assert "| 0.6 | - | at step 1000 | - | - |" in accuracy  # under way: its step, no figure
    assert "| 0.7 | - | - | - | - |" in accuracy  # seed 1's cell is not the grid's seed
    assert "| 0.5 | - | - | - | 55.09 / 65.16 |" in accuracy
    assert "| 0.8 | inf / 9.11 / 7.51 | - | - | - |" in epsilon
    assert "| 0.5 | - | - | - | 3.15 / 3.15 / 6.74 |" in epsilon


def test_claim_4_reads_the_grids_rank_correlation_with_the_noise(tmp_path: Path) -> None:
    mod = _mod()

    def cell(name: str, z: float, accuracy: float, steps: int = 2000) -> None:
        _write_run(tmp_path, name, [(steps, accuracy, 0.6)], steps=steps)
        file = tmp_path / name / "summary.json"
        file.write_text(json.dumps(json.loads(file.read_text()) | {"noise_multiplier": z}))

    cell("regular-5shot-lodmeta-eps0.8-d0.4-s0", 1.9, 0.5601)
    cell("regular-5shot-lodmeta-eps0.5-d0.4-s0", 3.0, 0.5513)
    assert mod["grid_trend"](mod["read_runs"](tmp_path)) is None  # two cells: no correlation
    cell("regular-5shot-lodmeta-eps0.5-d1e-05-s0", 9.7, 0.5509)
    # neither a cell under way, another seed's, nor a ladder rung counts
    cell("regular-5shot-lodmeta-eps0.5-d0.1-s0", 4.5, 0.70, steps=1000)
    cell("regular-5shot-lodmeta-eps0.6-d0.1-s1", 3.8, 0.70)
    cell("regular-5shot-lodmeta-z0.1-d1e-05-r500-s0", 0.1, 0.40, steps=500)
    rho, p, n = mod["grid_trend"](mod["read_runs"](tmp_path))
    assert (rho, n) == (-1.0, 3) and 0 <= p <= 1
    claim = mod["claims"](mod["read_runs"](tmp_path))[3]
    assert "Spearman rho -1.00 over 3 cells" in claim and ": inconclusive [" in claim


def test_claim_6_compares_the_walk_with_the_server_methods(tmp_path: Path) -> None:
    """The paper's reading of its Figures 1-4: LoDMeta and LoDMeta(basic) end level with MAML
    and FedAlt (within 1 point) on the training clients and level or above on the unseen ones;
    each pair named, decided only on three seeds."""
    mod = _mod()
    finals = {  # (training, unseen) at the last evaluation, seeds 0-2 alike
        "lodmeta": (0.90, 0.60),
        "lodmeta_basic": (0.91, 0.70),
        "fedmaml": (0.905, 0.65),
        "fedalt": (0.85, 0.50),
    }
    for method, (acc, unseen) in finals.items():
        for seed in range(3):
            bump = 0.001 * seed  # a spread, so that >= has a standard error
            _write_run(
                tmp_path, f"regular-5shot-{method}-s{seed}", [(8, acc + bump, unseen + bump)]
            )
    six = mod["claims"](mod["read_runs"](tmp_path))[-1]
    assert six.startswith("6. Figures 1-4: ")
    assert "lodmeta - fedmaml, training -0.50 (3/3 seeds), supported" in six
    assert "lodmeta_basic - fedalt, training +6.00 (3/3 seeds), NOT supported" in six
    assert "lodmeta - fedmaml, unseen -5.00 (3/3 seeds), NOT supported" in six
    assert "lodmeta_basic - fedmaml, unseen +5.00 (3/3 seeds), supported" in six
    assert ": NOT supported [" in six
    # one seed of the server methods: every pair inconclusive, none decided
    for method in ("fedmaml", "fedalt"):
        for seed in (1, 2):
            shutil.rmtree(tmp_path / f"regular-5shot-{method}-s{seed}")
    six = mod["claims"](mod["read_runs"](tmp_path))[-1]
    assert ": inconclusive [" in six and "supported" not in six.split("[", 1)[1]
