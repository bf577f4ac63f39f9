"""Where long benchmark runs keep their output: outside the work tree; and what they keep inside it.

A checkout can be laid anew between sessions, and a git-ignored folder inside it goes with it (a
HyperFL run lost its round-145 checkpoint that way). ``$FEDSWEEP_RUNS`` overrides the default
``~/.cache/fedsweep-runs``.

That folder does not survive a new machine either (session 28 found an empty home: every
checkpoint and every ended run of sessions 17-27 gone, their figures left only in BENCHMARKS.md).
So a run that ends also leaves a *record* (:func:`write_record`): one small JSON file under
``benchmarks/records/<kind>/<run>.json`` (``--records``), its summary, the config it ran, the
machine, the seconds spent and a compact per-round curve, committed with the repository. The
``--summary`` tables read run folders and records together (:func:`scan_runs`; a folder wins over
its own record), so the seeds of a table can come from different machines and sessions.

A run with early stopping also keeps ``best.pt``, the engine's state after the round that ended
its best validation window (rewritten at each new best), so that its best-validation model can
be measured on every client afterwards (:func:`evaluate_all_clients`, ``all_clients.json``): a
round's accuracies are means over its sampled clients, and the window's figure a mean of such
means. A run that ended before ``best.pt`` existed gets it by a replay from round 0 to its best
round (:func:`replay_best`, deterministic: its logged rows must match the run's own).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "ALL_CLIENTS",
    "BEST",
    "CURVE_KEYS",
    "WIDTH_CURVE_KEYS",
    "WIDTH_CURVE_PREFIXES",
    "curve_columns",
    "LEAKAGE_KEYS",
    "attacked_run",
    "MIN_SEEDS",
    "RECORDS",
    "claim_line",
    "combine",
    "compare",
    "epsilon_cell",
    "evaluate_all_clients",
    "read_curve",
    "record_file",
    "records_dir",
    "replay_best",
    "resume_run",
    "run_cases",
    "run_lock",
    "RunBusy",
    "add_to_record",
    "ended_rows",
    "run_ended",
    "runs_dir",
    "save_figure",
    "scan_runs",
    "summary_ended",
    "under_way_note",
    "truncate_log",
    "write_record",
    "add_all_clients_to_record",
]

#: the committed records of ended runs, one folder per script (``--records``);
#: ``$FEDSWEEP_RECORDS`` moves them (the tests send theirs to a temporary folder)
RECORDS = Path(os.environ.get("FEDSWEEP_RECORDS") or Path(__file__).resolve().parent / "records")
#: the per-round metrics a record keeps (those a run logs): the curves and the privacy spent
CURVE_KEYS = (
    "round",
    "train_loss",
    "accuracy",
    "accuracy_before",
    "val_accuracy",
    "val_accuracy_before",
    "global_accuracy",
    "unseen_accuracy",
    "test_loss",
    "selected_alpha",
    "comm_units",
    "bytes_up",
    "bytes_down",
    "epsilon",
)
#: the per-width accuracies of capacity-heterogeneous runs (``accuracy_width_<p>``, its
#: ``_before`` twin and the worst width's): kept too, each width's column after the fixed ones
WIDTH_CURVE_PREFIXES = ("accuracy_width_", "accuracy_before_width_")
WIDTH_CURVE_KEYS = ("accuracy_worst_width", "accuracy_before_worst_width")


#: a run's state after its best validation window's last round (runs with early stopping)
BEST = "best.pt"
#: every client measured on the best-validation state (:func:`evaluate_all_clients`)
ALL_CLIENTS = "all_clients.json"
#: the code a run started on (``_machine.code_version``), kept for its record
CODE = "code.json"
#: the metrics a replay must reproduce, round for round, before its state stands for the run's
REPLAY_KEYS = ("train_loss", "accuracy", "accuracy_before", "val_accuracy", "val_accuracy_before")


def runs_dir(*parts: str) -> Path:
    """``$FEDSWEEP_RUNS`` (default ``~/.cache/fedsweep-runs``) joined with ``parts``."""
    root = os.environ.get("FEDSWEEP_RUNS") or "~/.cache/fedsweep-runs"
    return Path(root).expanduser().joinpath(*parts)


class RunBusy(RuntimeError):
    """A run folder another process is running (:func:`run_lock`)."""


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the block: an ``flock`` on ``run.lock``, which the kernel
    drops when the process holding it ends (a killed run leaves no stale lock). Two processes
    resuming one folder (the queue and a run started by hand) would each write checkpoints and
    logs over the other's.

    Raises:
        RunBusy: another process holds it (its PID in the message), before anything is read or
            written in the folder.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "run.lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            raise RunBusy(
                f"{run_dir} is being run by another process (pid {holder}); it was left alone"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def resume_run(
    cfg: Any,
    run_dir: Path,
    *,
    checkpoint_every: int,
    deadline: float,
    until_round: int | None = None,
    record: Path | None = None,
) -> tuple[Any, dict[str, Any], float]:
    """Run (or resume, or only read) the engine of ``cfg`` in ``run_dir``, resumably, under the
    folder's :func:`run_lock` (:class:`RunBusy` if another process runs it).

    ``checkpoint.pt`` holds the engine's whole state, written every ``checkpoint_every`` rounds
    and when the run ends (its last round, its early stop or ``until_round``); ``metrics.jsonl``
    one row per round (rows past the checkpoint are dropped on resume: the rounds replay);
    ``spent.json`` the wall seconds spent over every invocation; ``summary.json`` the engine's
    summary. A run stops cleanly at the first checkpoint after ``deadline`` (a ``time.time()``).
    A SIGTERM stops it cleanly too (:func:`stopping_on_sigterm`): the round under way ends, is
    checkpointed, the summary written, and the process exits with status 143. Progress goes to
    stderr, a line a minute at most and one when the rounds stop (:func:`progress_line`).
    With early stopping, :data:`BEST` holds the state after each new best window's last round.

    A round whose training loss is NaN or infinite ends the run as the sweeps' trainable does
    (sweeps/trainable.py): checkpointed there, its summary carrying ``diverged_round``, never
    resumed (``diverged.json`` marks the folder), instead of training on NaN weights to the end.

    A run that stopped early under the rule it ran with stays ended, whatever the config's rule
    says now (an early-stopping window added since would let it go on: it would then be another
    run, trained partly under other code): its checkpoint is read, no round runs, and its own
    ``summary.json`` is returned unchanged.

    Once the run has ended (its last round, its early stop or its divergence, now or before), its
    record goes to the file ``record`` when given and not yet written (:func:`write_record`).
    Returns the engine, its summary and the seconds spent.
    """
    with run_lock(run_dir):
        return _resume_run(
            cfg,
            run_dir,
            checkpoint_every=checkpoint_every,
            deadline=deadline,
            until_round=until_round,
            record=record,
        )


def _resume_run(
    cfg: Any,
    run_dir: Path,
    *,
    checkpoint_every: int,
    deadline: float,
    until_round: int | None,
    record: Path | None,
) -> tuple[Any, dict[str, Any], float]:
    from flcore.experiment import build_data, build_engine
    from sweeps.cli import jsonable

    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt, log = run_dir / "checkpoint.pt", run_dir / "metrics.jsonl"
    spent_file, summary_file = run_dir / "spent.json", run_dir / "summary.json"
    engine = build_engine(cfg, data=build_data(cfg))
    spent = 0.0
    ended_before: dict[str, Any] | None = None
    if ckpt.is_file():
        engine.load_checkpoint(ckpt)
        spent = float(json.loads(spent_file.read_text())["seconds"])
        truncate_log(log, engine.round)
        before = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
        if before.get("early_stopped") == 1.0 and not engine.finished:
            # it stopped under the rule it ran with, and the config's rule (an early-stopping
            # window added since) would go on: an ended run stays ended, its summary its own
            engine.stopped_early = True
            ended_before = before
    elif log.is_file():
        log.unlink()  # rounds logged before a first checkpoint that never came
    if not ckpt.is_file():  # a run starts (again): the code it starts on
        from _machine import code_version

        # and the rounds it is to do: a --summary tells a paused run from an ended one by them
        (run_dir / CODE).write_text(json.dumps({"started": code_version(), "rounds": cfg.rounds}))
    start = time.perf_counter()
    until = min(engine.rounds, until_round or engine.rounds)
    marker = run_dir / "diverged.json"
    diverged = json.loads(marker.read_text())["round"] if marker.is_file() else None
    go = diverged is None and not engine.finished and engine.round < until
    shown, latest = time.monotonic(), None
    with stopping_on_sigterm() as term:
        rounds = engine.iter_rounds() if go and time.time() < deadline and not term.asked else None
        for result in rounds or ():
            if result.metrics.get("accuracy") is not None:
                latest = result.metrics["accuracy"]
            with log.open("a") as f:
                row = {"round": result.round, **result.metrics}
                f.write(json.dumps({k: jsonable(v) for k, v in row.items()}) + "\n")
            loss = result.metrics.get("train_loss")
            if loss is not None and not math.isfinite(loss):
                diverged = result.round
                marker.write_text(json.dumps({"round": diverged, "train_loss": jsonable(loss)}))
            if engine.early_stopping_metric is not None and engine.best_round == result.round:
                engine.save_checkpoint(run_dir / BEST)  # a new best window ends here
            stop = engine.finished or result.round == until_round or diverged is not None
            last = stop or term.asked
            if result.round % checkpoint_every == 0 or last:
                engine.save_checkpoint(ckpt)
                total = spent + time.perf_counter() - start
                spent_file.write_text(json.dumps({"seconds": total}))
                last = last or time.time() > deadline
            if last or time.monotonic() - shown >= PROGRESS_SECONDS:
                shown = time.monotonic()
                elapsed = spent + time.perf_counter() - start
                line = progress_line(run_dir.name, result.round, until, latest, elapsed)
                print(line, file=sys.stderr, flush=True)
            if last:
                break
        if rounds is not None:
            rounds.close()
    if spent_file.is_file():  # every way out of the rounds passes a checkpoint first
        spent = float(json.loads(spent_file.read_text())["seconds"])
    if ended_before is not None:
        summary = ended_before
    else:
        summary = engine.summary()
        if diverged is not None:
            summary["diverged_round"] = diverged
        summary_file.write_text(json.dumps({k: jsonable(v) for k, v in summary.items()}, indent=1))
    # an ended run never changes: its first record stays (with the machine that ran it, also
    # when the folder was brought home from a GPU and is read back here)
    if record is not None and (engine.finished or diverged is not None) and not record.is_file():
        write_record(record, run_dir, cfg, spent)
    if term.asked:
        raise SystemExit(TERMINATED)
    return engine, summary, spent


#: the exit status of a run stopped by SIGTERM (128 + 15, as the shell reports a killed one)
TERMINATED = 143
#: a running run's progress line comes at most this often (and when its rounds stop)
PROGRESS_SECONDS = 60.0


def progress_line(name: str, round: int, rounds: int, accuracy: Any, seconds: float) -> str:
    """``[name] round R/N, accuracy A (last evaluated), S s spent``: a run's progress on stderr."""
    acc = "" if accuracy is None else f", accuracy {100 * float(accuracy):.2f} (last evaluated)"
    return f"[{name}] round {round}/{rounds}{acc}, {seconds:,.0f} s spent"


class _Term:
    asked = False


@contextlib.contextmanager
def stopping_on_sigterm() -> Iterator[_Term]:
    """While inside, a SIGTERM only sets ``asked`` on the yielded flag (the run loop then ends
    at the round under way, checkpointed); the handler before is restored on the way out, and
    in a thread other than the main one (where Python allows no handler) nothing changes."""
    import signal

    term = _Term()

    def ask(signum: int, frame: Any) -> None:
        term.asked = True

    try:
        before = signal.signal(signal.SIGTERM, ask)
    except ValueError:  # not the main thread
        yield term
        return
    try:
        yield term
    finally:
        signal.signal(signal.SIGTERM, before)


def run_ended(engine: Any, summary: dict[str, Any]) -> bool:
    """Whether a run :func:`resume_run` returned has ended: its last round, its early stop or
    its divergence (``diverged_round``)."""
    return bool(engine.finished) or summary.get("diverged_round") is not None


def replay_best(cfg: Any, run_dir: Path, *, checkpoint_every: int, deadline: float) -> Path | None:
    """:data:`BEST` for an ended run with early stopping that has none (it ended before runs
    kept one): the run is replayed from round 0 to its ``best_round`` in ``run_dir/replay``
    (resumable, like :func:`resume_run`: None while the replay has not got there by
    ``deadline``), and its logged rows of the best window's rounds (the last 10 up to the best
    round) must equal the run's own in :data:`REPLAY_KEYS` (to 1e-9): the engine's draws are
    derived from (seed, round, client), so the same code on the same kind of machine replays a
    run exactly. The replay's state then becomes ``best.pt`` and its folder goes.

    Raises:
        ValueError: the run has no ``best_round`` (no early stopping, or not ended).
        RuntimeError: the replay differs from the run (another machine, or changed code): the
            replay folder stays for a look, and nothing stands for the run's best state.
    """
    import shutil

    best_file = run_dir / BEST
    if best_file.is_file():
        return best_file
    summary = json.loads((run_dir / "summary.json").read_text())
    best = summary.get("best_round")
    if best is None:
        raise ValueError(f"{run_dir.name} has no best_round to replay to")
    replay = run_dir / "replay"
    engine, _, _ = resume_run(
        cfg, replay, checkpoint_every=checkpoint_every, deadline=deadline, until_round=int(best)
    )
    if engine.round < int(best):
        return None
    own = _rows_by_round(run_dir / "metrics.jsonl")
    again = _rows_by_round(replay / "metrics.jsonl")
    for r in range(max(1, int(best) - 9), int(best) + 1):
        for key in REPLAY_KEYS:
            a, b = own.get(r, {}).get(key), again.get(r, {}).get(key)
            same = (a is None and b is None) or (
                a is not None and b is not None and math.isclose(a, b, rel_tol=0, abs_tol=1e-9)
            )
            if not same:
                raise RuntimeError(
                    f"the replay of {run_dir.name} differs from the run at round {r}: {key} "
                    f"{b} against {a} (another machine or changed code?); {replay} is kept"
                )
    (replay / "checkpoint.pt").replace(best_file)
    shutil.rmtree(replay)
    return best_file


def _rows_by_round(log: Path) -> dict[int, dict[str, Any]]:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return {int(r["round"]): r for r in rows}


def evaluate_all_clients(
    cfg: Any, run_dir: Path, *, diverged_round: int | None = None
) -> dict[str, Any] | None:
    """Every client measured on the ended run's reported state (flcore's
    ``Engine.evaluate_clients``): :data:`BEST` for a run with early stopping (its best window's
    last round), else ``checkpoint.pt`` (its last round). Cached in :data:`ALL_CLIENTS` with
    ``state`` (the file) and ``state_round``; None when the state is not there (an early-stopping
    run that ended before runs kept ``best.pt``: :func:`replay_best` first). A run whose loss
    turned NaN in ``diverged_round`` is measured only on a best state from before that round
    (the state it reports), never on its last one: None otherwise."""
    import sys

    from flcore.experiment import build_data, build_engine

    target = run_dir / ALL_CLIENTS
    if target.is_file():
        return dict(json.loads(target.read_text()))
    engine = build_engine(cfg, data=build_data(cfg))
    state = run_dir / (BEST if engine.early_stopping_metric is not None else "checkpoint.pt")
    if not state.is_file():
        return None
    if diverged_round is not None and state.name != BEST:
        return None  # its last state is the NaN round's
    engine.load_checkpoint(state)
    if diverged_round is not None and engine.round >= diverged_round:
        return None  # the NaN round ended its best window
    print(
        f"{run_dir.name}: every client ({engine.data.num_clients}) on {state.name} "
        f"(round {engine.round})",
        file=sys.stderr,
        flush=True,
    )
    start = time.perf_counter()
    out = engine.evaluate_clients()
    doc = {
        "state": state.name,
        "state_round": engine.round,
        "seconds": round(time.perf_counter() - start, 1),
        **out,
    }
    write_json(target, doc)
    return doc


def _short(value: Any) -> Any:
    """A metric as a record keeps it: floats to 6 significant digits, inf as "inf"."""
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.6g}")
    return value


def curve_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The columns a record's curve keeps of ``rows``: the :data:`CURVE_KEYS` some round logged,
    then the per-width accuracies (:data:`WIDTH_CURVE_KEYS`, and each
    :data:`WIDTH_CURVE_PREFIXES` key by width, narrowest first), where the run had more than
    one width (one width's accuracies repeat ``accuracy``)."""
    logged = {k for r in rows for k, v in r.items() if v is not None}
    base = [k for k in CURVE_KEYS if k in logged]
    widths = sorted(
        (k for k in logged if k.startswith(WIDTH_CURVE_PREFIXES)),
        key=lambda k: (not k.startswith(WIDTH_CURVE_PREFIXES[0]), float(k.rsplit("_", 1)[1])),
    )
    if len({k.rsplit("_", 1)[1] for k in widths}) < 2:
        return base
    return base + [k for k in WIDTH_CURVE_KEYS if k in logged] + widths


def write_record(path: Path, run_dir: Path, cfg: Any, seconds: float) -> None:
    """The record of the ended run in ``run_dir``: its summary (as ``summary.json`` holds it),
    the config it ran (every field, overrides applied), the machine, the code (commit and
    changed files where the run started, from :data:`CODE`, and where it ended: a run resumed
    across commits shows both), the seconds spent and the
    :func:`curve_columns` of every logged round as columns and rows (a few tens of kB for 500
    rounds; about 130 kB more with the per-width accuracies of a Hetero run). Written
    atomically; an existing record of the same run is replaced."""
    from _machine import code_version, machine

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    columns = curve_columns(rows)
    started = run_dir / CODE
    doc = {
        "run": run_dir.name,
        "summary": json.loads((run_dir / "summary.json").read_text()),
        "config": json.loads(cfg.model_dump_json()),
        "machine": machine(),
        "code": {
            "started": json.loads(started.read_text())["started"] if started.is_file() else None,
            "ended": code_version(),
        },
        "seconds": round(seconds, 1),
        "curve": {
            "columns": columns,
            "rows": [[_short(r.get(k)) for k in columns] for r in rows],
        },
    }
    every = run_dir / ALL_CLIENTS
    if every.is_file():
        doc["all_clients"] = _record_all_clients(json.loads(every.read_text()))
    write_json(path, doc)


#: what a record keeps of each per-client row of ``all_clients.json`` (enough to pair two
#: methods' clients: benchmarks/reproduce_pa3dfl_table1.py ``paired_table``)
PER_CLIENT_KEYS = ("client", "width", "accuracy", "accuracy_before", "selected_alpha")


def _record_all_clients(doc: dict[str, Any]) -> dict[str, Any]:
    """What a record keeps of ``all_clients.json``: its means, and per client only
    :data:`PER_CLIENT_KEYS`."""
    out = {k: _short(v) for k, v in doc.items() if k != "per_client"}
    if "per_client" in doc:
        out["per_client"] = [
            {k: _short(row[k]) for k in PER_CLIENT_KEYS if k in row} for row in doc["per_client"]
        ]
    return out


def add_all_clients_to_record(path: Path, doc: dict[str, Any]) -> None:
    """Add an all-client evaluation to an existing record that lacks it, or its per-client
    rows to a record that kept only the means (the one thing added to a record after its run
    ended: a measurement of the same ended run's best state). A record with rows is replaced
    only by a re-measurement of the same state that keeps more per client (a
    :data:`PER_CLIENT_KEYS` key its rows lack, e.g. Pa3dFL's ``selected_alpha``, logged since
    session 34), and only when every client's accuracies are the record's.

    Raises ValueError: such a re-measurement disagrees with the record (another state)."""
    record = json.loads(path.read_text())
    kept = record.get("all_clients", {})
    new = _record_all_clients(doc)
    if "per_client" in kept:
        rows, fresh = kept["per_client"], new.get("per_client", [])
        if not fresh or {k for r in fresh for k in r} <= {k for r in rows for k in r}:
            return
        same = len(rows) == len(fresh) and all(
            a["client"] == b["client"]
            and all(math.isclose(a[k], b[k], rel_tol=1e-5) for k in ("accuracy", "accuracy_before"))
            for a, b in zip(rows, fresh, strict=True)
        )
        if not same:
            raise ValueError(
                f"{path.name}: the new all-client measurement differs from the record's "
                "per-client accuracies (another state?); the record is left as it is"
            )
    record["all_clients"] = new
    write_json(path, record)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """``doc`` to ``path`` atomically (a temporary file beside it, then replaced), its folder
    made where missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    tmp.replace(path)


#: the leakage metrics (flcore.attacks.evaluation) a leakage script keeps of each attacked case
LEAKAGE_KEYS = (
    "leak_psnr",
    "leak_psnr_baseline",
    "leak_psnr_gain",
    "leak_ssim",
    "leak_ssim_baseline",
    "leak_ssim_gain",
    "leak_identified",
    "leak_identified_p",
    "leak_informative",
    "leak_images",
    "leak_seconds",
)


def attacked_run(
    cfg: Any, state_dir: Path, *, checkpoint_every: int = 5
) -> tuple[Any, dict[str, Any]]:
    """Run the engine of ``cfg`` (its ``attack`` mapping: one leakage probe) to its end,
    resumably. IG's optimisation state is kept in ``state_dir`` (an attack killed mid-way
    resumes there), and so are the rounds trained before it: the engine is checkpointed every
    ``checkpoint_every`` rounds to ``engine-<config digest>.pt`` (with the seconds spent in a
    ``.json`` beside it), a run killed mid-way resumes from there (the next round exactly the
    one that was next, so the attacked upload is the uninterrupted run's), and both files go
    once the run has ended. Progress goes to stderr (:func:`progress_line`, a line a minute at
    most and one at the end). Returns the engine and the summary's :data:`LEAKAGE_KEYS` with
    ``seconds``, the run's wall time over every invocation."""
    from flcore.experiment import build_data, build_engine

    digest = hashlib.sha256(cfg.model_dump_json().encode()).hexdigest()[:24]
    ckpt = state_dir / f"engine-{digest}.pt"
    spent_file = ckpt.with_suffix(".json")
    engine = build_engine(cfg, data=build_data(cfg))
    engine.probes[0].attack.resume_dir = state_dir
    spent = 0.0
    if ckpt.is_file():
        engine.load_checkpoint(ckpt)
        if spent_file.is_file():  # a kill between the two writes leaves the older count
            spent = float(json.loads(spent_file.read_text())["seconds"])
    began = time.perf_counter()
    shown = began
    for result in engine.iter_rounds():
        now = time.perf_counter()
        if result.round % checkpoint_every == 0 and not engine.finished:
            engine.save_checkpoint(ckpt)
            spent_file.write_text(json.dumps({"seconds": spent + now - began}))
        if now - shown >= PROGRESS_SECONDS or engine.finished:
            shown = now
            line = progress_line("leakage", result.round, engine.rounds, None, spent + now - began)
            print(line, file=sys.stderr, flush=True)
    summary = engine.summary()
    seconds = round(spent + time.perf_counter() - began, 1)
    ckpt.unlink(missing_ok=True)
    spent_file.unlink(missing_ok=True)
    return engine, {k: summary.get(k) for k in LEAKAGE_KEYS} | {"seconds": seconds}


def run_cases(
    out: Path,
    cases: Iterable[tuple[str, Callable[[], dict[str, Any]]]],
    record: Path | None = None,
) -> dict:
    """Run each ``(key, case)`` whose key is not yet under ``cases`` in the JSON file ``out``
    (a resumable chunk: a case in the file is not run again), rewriting the file after each
    case; the file keeps the machine of its first run (``_machine.machine``). Progress goes to
    stderr. Returns the whole document.

    ``record`` (a committed JSON file of the same layout, gathered across machines and
    sessions) is read first: a case it holds is not run again (a laid-anew machine's empty
    ``out`` does not redo it), and each case that ends here is written into it too, with this
    machine and the code it started with (:func:`add_to_record`)."""
    from _machine import code_version, machine

    out.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    doc.setdefault("machine", machine())
    done = doc.setdefault("cases", {})
    kept: dict[str, Any] = {}
    if record is not None and record.is_file():
        kept = json.loads(record.read_text()).get("cases", {})
    for key, case in cases:
        if key in done:
            continue
        if key in kept:
            print(f"[leakage] {key}: in {record}, not run again", file=sys.stderr, flush=True)
            continue
        print(f"[leakage] {key}", file=sys.stderr, flush=True)
        code = code_version()  # the code the case starts with (a commit may land meanwhile)
        done[key] = case()
        print(f"[leakage] {key}: {done[key]}", file=sys.stderr, flush=True)
        out.write_text(json.dumps(doc, indent=1))
        if record is not None:
            add_to_record(record, "cases", key, done[key], code)
    return doc


def add_to_record(
    record: Path, section: str, key: str, entry: dict[str, Any], code: dict[str, Any]
) -> None:
    """Write ``entry`` under ``doc[section][key]`` of the committed record file ``record``
    (made if need be), with this machine and ``code`` (``_machine.code_version`` where the
    measurement started), atomically."""
    from _machine import machine

    doc: dict[str, Any] = json.loads(record.read_text()) if record.is_file() else {}
    doc.setdefault(section, {})[key] = entry | {"machine": machine(), "code": code}
    write_json(record, doc)


def read_curve(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One dict per logged round of a run that :func:`scan_runs` found: its folder's
    ``metrics.jsonl`` (every key), or its record's curve (the :func:`curve_columns` it kept)."""
    if run.get("folder") is not None:
        log = Path(run["folder"]) / "metrics.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    curve = run["record"]["curve"]
    return [dict(zip(curve["columns"], row, strict=True)) for row in curve["rows"]]


def save_figure(fig: Any, path: Path) -> str:
    """Write a matplotlib figure to ``path`` as a PNG (its folder made if need be: on a fresh
    machine a summary reads the committed records alone), close it, and return the path."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def truncate_log(log: Path, rounds_done: int) -> None:
    """Drop the rows of rounds after the checkpoint: a stopped run replays them on resume."""
    if not log.is_file():
        return
    rows = [line for line in log.read_text().splitlines() if line.strip()]
    keep = [line for line in rows if json.loads(line)["round"] <= rounds_done]
    if len(keep) != len(rows):
        log.write_text("".join(line + "\n" for line in keep))


def add_run_options(ap: Any, out: str, *, rounds_help: str, summary_help: str) -> None:
    """The options every resumable reproduction script takes: seeds, rounds, where runs live,
    workers, checkpointing and stopping, ``--set`` variants with their ``--label``, and
    ``--summary``."""
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--rounds", type=int, default=None, help=rounds_help)
    ap.add_argument("--out", default=str(runs_dir(out)))
    ap.add_argument(
        "--records",
        default=str(RECORDS / out),
        help="where an ended run leaves its record (committed with the repository), and where "
        "--summary reads them beside OUT's folders; '' for none",
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--max-minutes", type=float, default=float("inf"))
    ap.add_argument("--set", action="append", default=[], help="key=value for every run")
    ap.add_argument("--label", default="", help="names the --set variant in run folders")
    ap.add_argument(
        "--until-round",
        type=int,
        default=None,
        help="stop (with a checkpoint) after this round; the run stays a --rounds run",
    )
    ap.add_argument(
        "--device",
        default=None,
        help="where the runs compute (cpu, cuda): not a setting, a run keeps its folder and "
        "stays comparable; on cuda ``executor: auto`` vectorizes where the algorithm allows",
    )
    ap.add_argument(
        "--global-eval-every",
        type=int,
        default=None,
        help="measure the global model on the global test set (global_accuracy) only every N "
        "rounds and in the last (config global_eval_every): not a setting, training and every "
        "client figure are the same, the run keeps its folder and stays comparable",
    )
    ap.add_argument("--summary", action="store_true", help=summary_help)


def records_dir(args: Any) -> Path | None:
    """``--records`` as a folder, or ``None`` for ``--records ''`` (no records)."""
    return Path(args.records) if args.records else None


def record_file(args: Any, run_name: str) -> Path | None:
    """Where the run ``run_name`` leaves its record under ``--records`` (``None``: nowhere)."""
    folder = records_dir(args)
    return None if folder is None else folder / f"{run_name}.json"


def epsilon_cell(values: list[float], fmt: str = ".2f") -> str:
    """A markdown cell for a row's epsilons over its seeds: the largest (a guarantee is reported
    at its weakest, never at the first or best seed's), ``inf`` where a seed has none, ``-``
    where none was logged."""
    if not values:
        return "-"
    worst = max(values)
    return "inf" if math.isinf(worst) else format(worst, fmt)


def execution_overrides(args: Any) -> list[str]:
    """The config overrides of ``--device`` and ``--global-eval-every`` (none without them):
    where and how often the run measures, never what it trains."""
    out = [] if args.device is None else [f"device={args.device}", "executor=auto"]
    every = getattr(args, "global_eval_every", None)
    return out + ([] if every is None else [f"global_eval_every={every}"])


def seed_cell(values: list[float]) -> str:
    """A markdown cell: the mean over seeds, ``± std`` when there are several, ``-`` for none."""
    import statistics

    if not values:
        return "-"
    mean = statistics.fmean(values)
    return f"{mean:.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{mean:.2f}"


#: seeds a comparison needs before it can decide a claim (the paper averages 3)
MIN_SEEDS = 3


def compare(a: list[float], b: list[float], relation: str) -> tuple[str, str]:
    """Whether seed values ``a`` stand in ``relation`` (``>=``, ``>`` or ``~``: within 1 point)
    to ``b``: ``not measured`` (a side has no run), ``inconclusive`` (fewer than
    :data:`MIN_SEEDS` seeds a side, or for ``>=``/``>`` a difference of the means within two
    standard errors), ``supported`` or ``NOT supported``; and the difference shown."""
    if not a or not b:
        return "not measured", "-"
    d = statistics.fmean(a) - statistics.fmean(b)
    shown = f"{d:+.2f} ({len(a)}/{len(b)} seeds)"
    if min(len(a), len(b)) < MIN_SEEDS:
        return "inconclusive", shown
    if relation == "~":
        return ("supported" if abs(d) <= 1.0 else "NOT supported"), shown
    se = (statistics.variance(a) / len(a) + statistics.variance(b) / len(b)) ** 0.5
    if abs(d) <= 2 * se:
        return "inconclusive", shown
    ok = d >= 0 if relation == ">=" else d > 0
    return ("supported" if ok else "NOT supported"), shown


def combine(verdicts: list[str]) -> str:
    for worst in ("NOT supported", "not measured", "inconclusive"):
        if worst in verdicts:
            return worst
    return "supported"


def claim_line(n: int, text: str, parts: list[tuple[str, str]]) -> str:
    """``N. text: <the parts' combined verdict> [<each part's figures, and its verdict>]``,
    ``parts`` as :func:`compare` gives them (a part not measured shows ``-``)."""
    shown = "; ".join(f"{fig}, {verdict}" if fig != "-" else fig for verdict, fig in parts)
    return f"{n}. {text}: {combine([p[0] for p in parts])} [{shown}]"


def scan_runs(
    out: Path,
    pattern: Any,
    methods: Any,
    records: Path | None = None,
    *,
    under_way: bool = False,
    length: int | None = None,
) -> list[dict[str, Any]]:
    """Every run under ``out`` whose name matches ``pattern`` (a compiled regex with groups
    ``setting``, ``name`` and ``seed``, and any others) and that holds a ``summary.json``, and
    every record ``<run>.json`` under ``records`` whose run has no such folder in ``out``: the
    groups (``seed`` as an int), ``method`` (the longest of ``methods`` the name starts with),
    ``label`` (the rest of the name), ``summary``, ``folder`` (``None`` for a record) or
    ``record`` (the record's JSON), and ``ended`` (:func:`_folder_ended`; a record's run has
    ended). ``under_way``: also the folders with a ``metrics.jsonl`` and no summary yet (a first
    chunk still running), their summary ``{}``. ``length``: the rounds of a folder that does not
    say how many it is to do (one started before its :data:`CODE` said)."""
    found: dict[str, tuple[dict[str, Any], Path | None, dict[str, Any] | None]] = {}
    recorded: set[str] = set()
    for file in sorted(records.glob("*.json")) if records is not None and records.is_dir() else []:
        if pattern.match(file.stem) is None:
            continue  # not a run's record
        doc = json.loads(file.read_text())
        found[file.stem] = (doc["summary"], None, doc)
        recorded.add(file.stem)
    for folder in sorted(out.iterdir()) if out.is_dir() else []:
        summary_file = folder / "summary.json"
        if summary_file.is_file():
            found[folder.name] = (json.loads(summary_file.read_text()), folder, None)
        elif under_way and (folder / "metrics.jsonl").is_file():
            found[folder.name] = ({}, folder, None)
    runs = []
    for run_name in sorted(found):
        m = pattern.match(run_name)
        if m is None:
            continue
        name = m["name"]
        method = next((x for x in sorted(methods, key=len, reverse=True) if name.startswith(x)), "")
        if not method or (name != method and not name.startswith(method + "-")):
            continue
        summary, folder, record = found[run_name]
        groups = {k: v for k, v in m.groupdict().items() if k != "name"}
        runs.append(
            groups
            | {
                "seed": int(m["seed"]),
                "method": method,
                "label": name[len(method) + 1 :],
                "summary": summary,
                "folder": folder,
                "record": record,
                "ended": run_name in recorded
                or folder is None
                or _folder_ended(summary, folder, length),
            }
        )
    return runs


def summary_ended(summary: dict[str, Any], planned: int | None) -> bool:
    """Whether a run whose ``summary.json`` is ``summary`` has ended: its early stop, its
    divergence (a NaN loss, ``diverged_round``), or all ``planned`` rounds (unknown: under way).
    A paused run's summary is that of its rounds so far, and has none of them. The one rule of
    every script's summary."""
    if summary.get("early_stopped") or summary.get("diverged_round") is not None:
        return True
    return planned is not None and int(summary.get("rounds") or 0) >= int(planned)


def _folder_ended(summary: dict[str, Any], folder: Path, length: int | None) -> bool:
    """:func:`summary_ended` for the run in ``folder``: the rounds its :data:`CODE` says it is to
    do, ``length`` where it does not say."""
    code = folder / CODE
    planned = json.loads(code.read_text()).get("rounds") if code.is_file() else None
    return summary_ended(summary, planned if planned is not None else length)


def ended_rows(runs: list[dict[str, Any]], group: Callable[[list[dict[str, Any]]], Any]) -> Any:
    """A summary's rows, one per (setting, method, label): ``group`` (a script's grouping) of
    each row's ended runs (:func:`scan_runs`' ``ended``), or of all its runs while none has
    ended (a row of runs so far); and each row's runs under way beside its ended ones (to
    name, :func:`under_way_note`)."""
    by_row: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        by_row.setdefault((r["setting"], r["method"], r["label"]), []).append(r)
    shown: list[dict[str, Any]] = []
    paused: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for key, row in by_row.items():
        ended = [r for r in row if r["ended"]]
        shown += ended or row
        paused[key] = [r for r in row if not r["ended"]] if ended else []
    return group(shown), paused


def under_way_note(runs: list[dict[str, Any]], key: str = "accuracy", unit: str = "round") -> str:
    """``; under way: seed S at round R (A so far)``, for the runs of :func:`ended_rows` under
    way beside a row's ended ones (``key``'s figure in %, the engine's rounds called
    ``unit``; nothing if none)."""
    parts = []
    for r in sorted(runs, key=lambda r: r["seed"]):
        s = r["summary"]
        figure = f" ({100 * float(s[key]):.2f} so far)" if s.get(key) is not None else ""
        parts.append(f"seed {r['seed']} at {unit} {int(s.get('rounds') or 0)}{figure}")
    return f"; under way: {', '.join(parts)}" if parts else ""
