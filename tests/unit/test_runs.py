"""benchmarks/_runs.py: a run whose training loss turns NaN ends there (checkpointed, marked, never
resumed) and still leaves its record; an ended run's record holds its summary, config and curve;
a leakage run killed mid-way resumes from its last checkpoint to the uninterrupted result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _runs import (  # noqa: E402
    RunBusy,
    attacked_run,
    resume_run,
    run_ended,
    run_lock,
    summary_ended,
)


def test_a_diverged_run_ends_at_its_nan_round_and_is_never_resumed(
    tiny_config: dict, tmp_path: Path
) -> None:
    from flcore.config import ExperimentConfig

    # a step size no network survives: the first round's loss is already inf or NaN
    cfg = ExperimentConfig.model_validate(tiny_config | {"rounds": 4, "lr": 1e12})
    run_dir, record = tmp_path / "run", tmp_path / "records" / "run.json"
    engine, summary, _ = resume_run(
        cfg, run_dir, checkpoint_every=10, deadline=time.time() + 600, record=record
    )
    assert summary["diverged_round"] == 1 and run_ended(engine, summary)
    assert engine.round == 1 and not engine.finished  # 3 rounds left, none trained
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1] and rows[0]["train_loss"] in (None, "inf")
    assert (run_dir / "checkpoint.pt").is_file()  # checkpointed at once, not at round 10
    assert json.loads((run_dir / "diverged.json").read_text())["round"] == 1
    doc = json.loads(record.read_text())
    assert doc["summary"]["diverged_round"] == 1 and doc["config"]["lr"] == 1e12

    # invoked again, it only reads the run back: no round replays on NaN weights, and the first
    # record stays (it names the machine that ran the run)
    record.write_text('{"kept": true}')
    engine, summary, _ = resume_run(
        cfg, run_dir, checkpoint_every=10, deadline=time.time() + 600, record=record
    )
    assert engine.round == 1 and summary["diverged_round"] == 1
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1
    assert json.loads(record.read_text()) == {"kept": True}


def test_a_run_leaves_its_record_only_once_it_has_ended(tiny_config: dict, tmp_path: Path) -> None:
    from flcore.config import ExperimentConfig

    cfg = ExperimentConfig.model_validate(tiny_config)  # 2 rounds
    run_dir, record = tmp_path / "run", tmp_path / "records" / "run.json"
    kwargs = {"checkpoint_every": 1, "deadline": time.time() + 600, "record": record}
    engine, summary, _ = resume_run(cfg, run_dir, until_round=1, **kwargs)
    assert engine.round == 1 and not run_ended(engine, summary) and not record.exists()
    # the summaries' rule, on the summary a paused run left: under way, whatever its length
    paused = json.loads((run_dir / "summary.json").read_text())
    assert not summary_ended(paused, 2) and not summary_ended(paused, None)
    assert summary_ended(paused, 1)  # all its rounds, had it planned one
    assert summary_ended(paused | {"early_stopped": 1.0}, 2)
    assert summary_ended(paused | {"diverged_round": 1}, 2)
    engine, summary, spent = resume_run(cfg, run_dir, **kwargs)
    assert run_ended(engine, summary) and "diverged_round" not in summary
    assert summary_ended(json.loads((run_dir / "summary.json").read_text()), 2)
    doc = json.loads(record.read_text())
    assert doc["run"] == "run" and doc["seconds"] == round(spent, 1)
    assert doc["summary"] == json.loads((run_dir / "summary.json").read_text())
    assert doc["config"] == json.loads(cfg.model_dump_json())
    columns, rows = doc["curve"]["columns"], doc["curve"]["rows"]
    assert columns[:3] == ["round", "train_loss", "accuracy"] and [r[0] for r in rows] == [1, 2]
    assert doc["machine"]["cpus"] >= 1
    import torch

    # the SIMD kernels torch ran (float results differ between them), with the CPU's flags
    assert doc["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert isinstance(doc["machine"]["cpu_flags"], list)
    # the code it ran: this checkout's commit where it started and where it ended
    head = subprocess.run(
        ["git", "-C", str(Path(__file__).resolve().parents[2]), "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    # (no git checkout, as on a device machine's copy of the tree: no commit, not a made-up one)
    assert doc["code"]["started"]["commit"] == doc["code"]["ended"]["commit"] == (head or None)
    assert isinstance(doc["code"]["ended"]["changed"], list)


def test_best_state_all_clients_and_replay(data_root: Path, tmp_path: Path) -> None:
    """A run with early stopping keeps its best window's state; every client is measured on it;
    a run without best.pt replays to its best round and must match its own log."""
    import pytest
    import torch
    from _runs import (
        ALL_CLIENTS,
        BEST,
        add_all_clients_to_record,
        evaluate_all_clients,
        replay_best,
    )

    from flcore.config import load_config
    from flcore.engine import checkpoint_round

    configs = Path(__file__).resolve().parents[2] / "sweeps" / "configs" / "pa3dfl"
    config = configs / "fmnist_hetero_local.yaml"
    over = [f"data_root={data_root}", "num_clients=5", "samples_per_client=50",
            "local_epochs=1", "rounds=6", "seed=0", "workers=1"]  # fmt: skip
    cfg = load_config(config, over)
    run_dir, record = tmp_path / "run", tmp_path / "records" / "run.json"
    kwargs = {"checkpoint_every": 10, "deadline": time.time() + 600}
    engine, summary, _ = resume_run(cfg, run_dir, record=record, **kwargs)
    assert run_ended(engine, summary)
    best = summary["best_round"]
    assert checkpoint_round(run_dir / BEST) == best

    doc = evaluate_all_clients(cfg, run_dir)
    assert doc is not None and doc["clients"] == 5 and len(doc["per_client"]) == 5
    assert (doc["state"], doc["state_round"]) == (BEST, best)
    assert 0 <= doc["accuracy"] <= 1 and doc["accuracy_worst_width"] <= doc["accuracy"]
    assert evaluate_all_clients(cfg, run_dir) == json.loads((run_dir / ALL_CLIENTS).read_text())
    # a run whose loss turned NaN is measured on a best state from before that round, or not
    (run_dir / ALL_CLIENTS).unlink()
    assert evaluate_all_clients(cfg, run_dir, diverged_round=best) is None  # the NaN round's
    assert not (run_dir / ALL_CLIENTS).exists()
    from flcore.config import validate_config

    no_stopping = validate_config(cfg.model_dump() | {"early_stopping": None})
    assert evaluate_all_clients(no_stopping, run_dir, diverged_round=best + 1) is None  # its last
    before = evaluate_all_clients(cfg, run_dir, diverged_round=best + 1)
    assert before is not None and (before["state"], before["state_round"]) == (BEST, best)
    assert before["per_client"] == doc["per_client"]
    # an older record kept the means only: the per-client rows are added to it
    old = json.loads(record.read_text())
    old["all_clients"] = {"accuracy": doc["accuracy"]}
    record.write_text(json.dumps(old))
    add_all_clients_to_record(record, doc)
    kept = json.loads(record.read_text())["all_clients"]
    assert kept["accuracy"] == pytest.approx(doc["accuracy"], rel=1e-5)
    # per client what pairs two methods' clients, nothing more
    assert [set(r) for r in kept["per_client"]] == [
        {"client", "width", "accuracy", "accuracy_before"}
    ] * 5
    assert [r["client"] for r in kept["per_client"]] == list(range(5))
    for mine, full in zip(kept["per_client"], doc["per_client"], strict=True):
        assert mine["accuracy"] == pytest.approx(full["accuracy"], rel=1e-5)
    add_all_clients_to_record(record, {"accuracy": 0.0})  # a record with rows is final
    assert json.loads(record.read_text())["all_clients"] == kept
    # ... unless the same state is measured again with more per client (Pa3dFL's alpha)
    rows = [{**r, "selected_alpha": 0.5} for r in doc["per_client"]]
    other = {**doc, "per_client": [{**r, "accuracy": r["accuracy"] + 0.1} for r in rows]}
    with pytest.raises(ValueError, match="differs from the record"):
        add_all_clients_to_record(record, other)  # not the same state
    assert json.loads(record.read_text())["all_clients"] == kept
    add_all_clients_to_record(record, {**doc, "per_client": rows})
    alphas = [
        r["selected_alpha"] for r in json.loads(record.read_text())["all_clients"]["per_client"]
    ]
    assert alphas == [0.5] * 5

    # a run that ended before runs kept best.pt: replayed to its best round, the same state
    original = torch.load(run_dir / BEST, weights_only=False)
    (run_dir / BEST).unlink()
    assert evaluate_all_clients(cfg, run_dir / "none") is None  # no state, nothing measured
    replayed = replay_best(cfg, run_dir, **kwargs)
    assert replayed == run_dir / BEST and not (run_dir / "replay").exists()
    again = torch.load(replayed, weights_only=False)
    assert again["round"] == best
    for key, value in original["client_states"][0].items():
        assert torch.equal(value, again["client_states"][0][key])

    # a replay that does not reproduce the run's log stands for nothing
    (run_dir / BEST).unlink()
    log = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    for row in rows:
        if row["round"] == best:
            row["train_loss"] += 0.5
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(RuntimeError, match=f"differs from the run at round {best}: train_loss"):
        replay_best(cfg, run_dir, **kwargs)
    assert not (run_dir / BEST).exists() and (run_dir / "replay").is_dir()


def test_a_run_that_stopped_under_its_rule_stays_ended_under_a_new_one(
    data_root: Path, tmp_path: Path
) -> None:
    """A run early-stopped before the configs gained a window: invoked again under the window
    rule (which would let it go on) it trains nothing, keeps its summary and its log."""
    from flcore.config import validate_config

    raw = {
        "experiment": "tests", "algorithm": "local", "dataset": "fmnist",
        "data_root": str(data_root), "num_clients": 4, "samples_per_client": 100,
        "client_split": {"train": 0.6, "val": 0.2, "test": 0.2}, "rounds": 20,
        "local_epochs": 1, "batch_size": 20, "lr": 0.005, "seed": 3, "workers": 1,
        "partition": {"name": "dominant", "s": 20},
        "early_stopping": {"metric": "val_accuracy", "patience": 0.1},
    }  # fmt: skip
    run_dir = tmp_path / "run"
    kwargs = {"checkpoint_every": 50, "deadline": time.time() + 600}
    engine, summary, _ = resume_run(validate_config(raw), run_dir, **kwargs)
    assert engine.stopped_early and engine.round < 20  # the premise: it stopped early
    log = (run_dir / "metrics.jsonl").read_text()
    saved = (run_dir / "summary.json").read_text()

    window = raw | {"early_stopping": {"metric": "val_accuracy", "patience": 1.0, "window": 3}}
    again, summary_again, _ = resume_run(validate_config(window), run_dir, **kwargs)
    assert again.round == engine.round and run_ended(again, summary_again)
    assert (run_dir / "metrics.jsonl").read_text() == log
    assert (run_dir / "summary.json").read_text() == saved
    assert summary_again == json.loads(saved)
    assert summary_again["best_round"] == summary["best_round"]


def _children(pid: int) -> list[int]:
    """The pids of ``pid``'s child processes (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # the fields after the command's closing parenthesis: state, ppid, ...
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.parametrize(
    "workers, whole_group",
    [
        pytest.param(1, False, id="to-its-pid"),
        # the queue's way with pool workers: `make slow` (README, "Tests")
        pytest.param(2, True, id="to-its-process-group-with-workers", marks=pytest.mark.slow),
    ],
)
def test_a_sigterm_stops_a_run_cleanly_at_the_round_under_way(
    tiny_config: dict, tmp_path: Path, workers: int, whole_group: bool
) -> None:
    """A run killed with SIGTERM (how a queue stops it) checkpoints the round under way, writes
    its summary and exits 143; resumed, it goes on from there with no round lost or repeated.
    Sent to the run's whole process group (``kill -- -<pgid>``) it stops the same way: the
    client workers are not in that group, so they live on to finish the round (in the group,
    they died of it and the run waited forever for their results), then go with the run,
    leaving no multiprocessing temp folder (each terminated worker used to leave one)."""
    import contextlib
    import os
    import signal

    cfg = tiny_config | {"rounds": 400, "eval_every": 1000, "workers": workers}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    run_dir = tmp_path / "run"
    bench = Path(__file__).resolve().parents[2] / "benchmarks"
    code = (
        f"import json, sys, time; from pathlib import Path; sys.path.insert(0, {str(bench)!r})\n"
        "from _runs import resume_run\n"
        "from flcore.config import ExperimentConfig\n"
        f"raw = json.loads(Path({str(tmp_path / 'cfg.json')!r}).read_text())\n"
        f"resume_run(ExperimentConfig.model_validate(raw), Path({str(run_dir)!r}), "
        "checkpoint_every=1000, deadline=time.time() + 600)\n"
    )
    scratch = tmp_path / "tmp"  # the run's TMPDIR, where multiprocessing makes its folders
    scratch.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=bench.parent,
        start_new_session=whole_group,
        env=os.environ | {"TMPDIR": str(scratch)},
    )
    log = run_dir / "metrics.jsonl"
    while proc.poll() is None and (not log.is_file() or len(log.read_text().splitlines()) < 3):
        time.sleep(0.05)
    workers_pids = _children(proc.pid) if workers > 1 else []
    assert workers == 1 or len(workers_pids) >= workers  # the pool's workers (and its tracker)
    if whole_group:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: the group is the run's
    else:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        assert proc.wait(timeout=120) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            for pid in workers_pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 30  # the workers went with it
    while any(Path(f"/proc/{pid}").exists() for pid in workers_pids) and time.time() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in workers_pids if Path(f"/proc/{pid}").exists()]
    assert not list(scratch.glob("pymp-*"))
    done = len(log.read_text().splitlines())
    assert 3 <= done < 400  # stopped on the way, not at a checkpoint_every multiple
    assert (run_dir / "checkpoint.pt").is_file() and (run_dir / "summary.json").is_file()
    from flcore.config import ExperimentConfig

    engine, _, _ = resume_run(
        ExperimentConfig.model_validate(cfg | {"rounds": done + 2}),
        run_dir,
        checkpoint_every=1000,
        deadline=time.time() + 600,
    )
    rows = [json.loads(line)["round"] for line in log.read_text().splitlines()]
    assert engine.round == done + 2 and rows == list(range(1, done + 3))


def test_a_run_reports_its_progress_on_stderr(
    tiny_config: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flcore.config import ExperimentConfig

    cfg = ExperimentConfig.model_validate(tiny_config)  # 2 rounds, evaluated every round
    resume_run(cfg, tmp_path / "run", checkpoint_every=10, deadline=time.time() + 600)
    lines = capsys.readouterr().err.splitlines()
    # a line a minute at most, and one when the rounds stop: here only that one
    assert len([x for x in lines if x.startswith("[run] ")]) == 1
    last = next(x for x in lines if x.startswith("[run] "))
    assert last.startswith("[run] round 2/2, accuracy ") and last.endswith(" s spent")
    # nothing left to run: no line
    resume_run(cfg, tmp_path / "run", checkpoint_every=10, deadline=time.time() + 600)
    assert not [x for x in capsys.readouterr().err.splitlines() if x.startswith("[run] ")]


def test_a_killed_leakage_run_resumes_from_its_checkpoint_to_the_same_attack(
    tiny_config: dict,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from flcore.attacks.ig import InvertingGradients
    from flcore.config import ExperimentConfig
    from flcore.engine import Engine

    attack = {"name": "ig", "rounds": [3], "clients": [0], "images": 1, "iterations": 3}
    cfg = ExperimentConfig.model_validate(
        tiny_config | {"rounds": 3, "full_last_round": True, "attack": attack}
    )
    _, whole = attacked_run(cfg, tmp_path / "whole", checkpoint_every=1)

    trained: list[int] = []
    one_round = Engine._one_round

    def counted(self: Engine, executor: object, r: int) -> object:
        trained.append(r)
        return one_round(self, executor, r)

    def killed(self: InvertingGradients, problem: object) -> None:
        raise KeyboardInterrupt  # the process dies in round 3's attack, after two rounds

    monkeypatch.setattr(Engine, "_one_round", counted)
    state = tmp_path / "state"
    with monkeypatch.context() as m:
        m.setattr(InvertingGradients, "solve", killed)
        with pytest.raises(KeyboardInterrupt):
            attacked_run(cfg, state, checkpoint_every=1)
    assert trained == [1, 2, 3] and len(list(state.glob("engine-*.pt"))) == 1
    trained.clear()
    capsys.readouterr()
    engine, resumed = attacked_run(cfg, state, checkpoint_every=1)
    assert trained == [3]  # rounds 1-2 come from the checkpoint, not trained again
    assert "[leakage] round 3/3, " in capsys.readouterr().err  # its end, on stderr
    assert engine.round == 3 and resumed["leak_images"] == 1
    timing = ("leak_seconds", "seconds")
    assert {k: v for k, v in resumed.items() if k not in timing} == {
        k: v for k, v in whole.items() if k not in timing
    }
    assert resumed["seconds"] > 0
    assert list(state.glob("engine-*")) == []  # an ended run leaves only IG's state
    assert len(list(state.glob("ig-*.pt"))) == 1


def test_a_run_folder_runs_in_one_process_at_a_time(tiny_config: dict, tmp_path: Path) -> None:
    from flcore.config import ExperimentConfig

    run_dir = tmp_path / "run"
    # another process holds the folder (an flock: per open file, so a second open conflicts)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; import time\n"
         "from _runs import run_lock\n"
         "with run_lock(Path(sys.argv[2])):\n    print('held', flush=True); time.sleep(60)",
         str(Path(__file__).resolve().parents[2] / "benchmarks"), str(run_dir)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        cfg = ExperimentConfig.model_validate(tiny_config | {"rounds": 1})
        with pytest.raises(RunBusy, match=f"pid {holder.pid}"):
            resume_run(cfg, run_dir, checkpoint_every=10, deadline=time.time() + 600)
        assert [p.name for p in run_dir.iterdir()] == ["run.lock"]  # nothing read or written
    finally:
        holder.kill()
        holder.wait()
    # the kernel dropped the dead holder's lock: the folder is free, and held by one at a time
    with (
        run_lock(run_dir),
        pytest.raises(RunBusy, match=f"pid {os.getpid()}"),
        run_lock(run_dir),
    ):
        pass
    with run_lock(run_dir):
        pass


def test_a_record_keeps_the_per_width_accuracies_narrowest_first() -> None:
    from _runs import curve_columns

    rows = [
        {"round": 1, "train_loss": 2.0, "accuracy": 0.5, "accuracy_width_0.5": 0.6,
         "accuracy_width_0.0625": 0.4, "accuracy_before_width_0.125": 0.3,
         "accuracy_worst_width": 0.4, "bytes_up_width_0.5": 10.0, "client_seconds": 1.0},
        {"round": 2, "train_loss": 1.0, "accuracy": 0.6, "accuracy_width_0.125": 0.5,
         "accuracy_width_0.0625": None, "global_accuracy": None},
    ]  # fmt: skip
    assert curve_columns(rows) == [
        "round",
        "train_loss",
        "accuracy",
        "accuracy_worst_width",
        "accuracy_width_0.0625",  # narrowest first, not in the rows' order
        "accuracy_width_0.125",
        "accuracy_width_0.5",
        "accuracy_before_width_0.125",
    ]  # per-width bytes and timings stay out; a never-logged key is no column
    # one width (Ideal): its accuracies repeat the run's, and no column keeps them
    ideal = [{"round": 1, "accuracy": 0.5, "accuracy_width_1": 0.5, "accuracy_worst_width": 0.5}]
    assert curve_columns(ideal) == ["round", "accuracy"]
