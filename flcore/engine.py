"""The round loop: sampling, local updates, streamed aggregation, evaluation, callbacks.

Randomness is derived, not carried: the clients of round r come from a generator seeded by
(seed, r), and client c's local stream in round r from (seed, r, c). A run restored from a
checkpoint after round r therefore continues with exactly the draws it would have made, and the
checkpoint needs no RNG state beyond the round number.

Early stopping (Pa3dFL, Appendix D.3: "early stopping when there is no gain in the optimal
validation metrics for more than 0.2R rounds"), on when ``early_stopping_metric`` is given:

- the tracked value of round r is the mean of the metric (``val_accuracy``, or
  ``val_accuracy_before``) over the clients *sampled in round r* that report it, i.e. over their
  own validation records (a ``client_split`` with val > 0); only evaluation rounds measure it,
  and a round that measures nothing (a Poisson-sampled round with no client, or a round whose
  clients report no validation metric) neither improves it nor counts as a check;
- with ``early_stopping_window`` W > 1 the tracked value is the mean of the last W measured
  values (of all so far before the W-th measurement): one round's value is a mean over
  its few sampled clients, so the best single round is mostly the luckiest draw of clients, and
  its test accuracy, measured on the same clients, shares that luck. Pa3dFL's configs use W =
  10 (200 client evaluations at fraction 0.2; BENCHMARKS.md measures what W = 1 overstates);
- a gain is a value strictly above the best so far (a tie is no gain); the best value and its
  round (the window's last) are kept;
- after a round that measured the metric, if ``round - best_round > patience x rounds`` and the
  run has rounds left, the run stops after this round (``stopped_early``);
- the run then reports its best-validation model: the summary's client accuracies
  (``accuracy``, ``accuracy_before``, the ``*_width_*`` keys) and ``global_accuracy`` are those
  recorded in the best round, or with W > 1 their means over the best window's rounds (a width
  cluster's over the window's rounds that sampled it; ``*_worst_width`` the lowest of those
  means), beside ``rounds_completed``, ``best_round``, ``best_window_start``,
  ``early_stopped`` (1.0 / 0.0) and ``best_<metric>``. Cumulative totals (bytes, seconds,
  epsilon) are those of every round actually run. Checkpoints carry this state;
- with ``early_stopping_report="all_clients"`` the engine also keeps the state the best window
  ended with (the algorithm's and every client's, a copy taken after each new best round, in
  memory and in checkpoints), and once the run has ended the summary reports that state
  measured on every client instead of the window's means: each client runs the evaluated local
  update the next round would run for it (:meth:`Engine.evaluate_clients`), and
  ``global_accuracy`` is the server's evaluation of that state. The summary then carries
  ``evaluated_clients`` (how many clients were measured); :meth:`Engine.best_state_evaluation`
  gives the per-client rows. The measurement runs once (cached, and checkpointed).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flcore.algorithms.base import Algorithm, ClientTask, tensor_bytes
from flcore.callbacks import Callback, CallbackList, RoundResult, RunInfo
from flcore.capacity import width_label
from flcore.data import FederatedData
from flcore.executor import AlgorithmFactory, make_executor, resolve_executor

__all__ = [
    "Engine",
    "CHECKPOINT_VERSION",
    "CLIENT_ACCURACIES",
    "VAL_ACCURACIES",
    "CLIENT_LOSSES",
    "recorded_client_metrics",
    "checkpoint_round",
    "window_mean",
]

CHECKPOINT_VERSION = 1

#: per-client test accuracies, averaged over a round's clients on evaluation rounds: after local
#: training, and of the model each client starts the round with (Algorithm.client_eval)
CLIENT_ACCURACIES = ("accuracy", "accuracy_before")
#: the same on the clients' validation records, where they have some (a ``client_split``)
VAL_ACCURACIES = ("val_accuracy", "val_accuracy_before")
#: the clients' test loss after local training (Algorithm.client_eval), averaged like the
#: accuracies on evaluation rounds where the clients measure it
CLIENT_LOSSES = ("test_loss",)


def recorded_client_metrics(client_metrics: tuple[str, ...]) -> frozenset[str]:
    """Every key of a client's ``ClientResult.metrics`` that a round records (beside the
    executor's ``client_seconds``), given the algorithm's ``client_metrics``."""
    return frozenset(
        ("train_loss", *CLIENT_ACCURACIES, *VAL_ACCURACIES, *CLIENT_LOSSES, *client_metrics)
    )


def _on_cpu(state: Any) -> Any:
    """A client state with its tensors on the CPU (CPU tensors as they are, not copied)."""
    if isinstance(state, torch.Tensor):
        return state.to("cpu")
    if isinstance(state, dict):
        return {k: _on_cpu(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_on_cpu(v) for v in state)
    return state


def window_mean(values: list[float]) -> float:
    """Early stopping's tracked value over a window: the exactly rounded mean (math.fsum), to 6
    decimals, so that windows of equal means tie whatever their order or the rounding of a
    logged curve (accuracies are fractions of a few hundred records; ties are common)."""
    return round(math.fsum(values) / len(values), 6)


def _window_mean(rows: list[dict[str, Any]], key: str) -> float | None:
    """The mean of ``key`` over the rows that measured it (None if none did)."""
    values = [float(v) for m in rows if (v := m.get(key)) is not None]
    return float(np.mean(values)) if values else None


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


class Engine:
    """Runs one FL experiment round by round.

    Args:
        factory: builds the algorithm (here and in each worker).
        data: the federated dataset.
        rounds: total rounds.
        client_fraction: fraction of clients sampled per round.
        full_last_round: every client takes part in the last round (HyperFL's protocol).
        eval_every: evaluate every this many rounds, and always in the last round.
        global_eval_every: of those evaluation rounds, the ones that also measure the global
            model on the global test set (``global_accuracy``, the base
            :meth:`~flcore.algorithms.base.Algorithm.evaluate_server`): rounds divisible by it,
            and always the last; None: every evaluation round. Training is the same either way
            (the evaluation draws nothing and changes nothing); the other rounds report
            ``global_accuracy`` None. An algorithm whose server evaluation is its accuracy
            (meta-learning) is unaffected.
        seed: the experiment seed.
        workers: client processes (1 = in this process).
        device: torch device.
        callbacks: consumers of per-round results.
        probes: evaluations that look at each round before it trains (e.g. a privacy attack
            on its uploads, flcore.attacks.evaluation): ``before_round(engine, round, tasks)``,
            ``round_metrics(round)`` and ``summary(engine)`` merge into the results,
            ``state_dict``/``load_state_dict`` into checkpoints. Their time is not counted in
            ``round_seconds``.
        early_stopping_metric: a validation metric (one of :data:`VAL_ACCURACIES`, higher is
            better) to stop on (see the module docstring); None: no early stopping.
        early_stopping_patience: the rounds without gain tolerated, as a fraction of
            ``rounds`` (Pa3dFL: 0.2).
        early_stopping_window: the measured rounds the tracked value averages (1: each round
            alone; see the module docstring).
        early_stopping_report: ``window`` (the best window's means) or ``all_clients``
            (the best window's final state measured on every client; see the module docstring).
        executor: ``loop`` (clients one by one, in process or a pool), ``vectorized`` (a
            round's clients as one batched computation, flcore.vectorized) or ``auto`` (see
            :func:`~flcore.executor.resolve_executor`).
        executor_chunk: clients per batched computation of the vectorized executor (None:
            a whole round).
    """

    def __init__(
        self,
        factory: AlgorithmFactory,
        data: FederatedData,
        *,
        rounds: int,
        client_fraction: float = 1.0,
        full_last_round: bool = True,
        eval_every: int = 1,
        global_eval_every: int | None = None,
        seed: int = 0,
        workers: int = 1,
        device: str = "cpu",
        callbacks: list[Callback] | None = None,
        probes: list[Any] | None = None,
        early_stopping_metric: str | None = None,
        early_stopping_patience: float = 0.2,
        early_stopping_window: int = 1,
        early_stopping_report: str = "window",
        executor: str = "loop",
        executor_chunk: int | None = None,
    ) -> None:
        if early_stopping_metric is not None and early_stopping_metric not in VAL_ACCURACIES:
            raise ValueError(
                f"early_stopping_metric must be one of {', '.join(VAL_ACCURACIES)}, "
                f"got {early_stopping_metric!r}"
            )
        if not 0 < early_stopping_patience <= 1:
            raise ValueError(
                f"early_stopping_patience must be in (0, 1], got {early_stopping_patience!r}"
            )
        if global_eval_every is not None and global_eval_every < 1:
            raise ValueError(f"global_eval_every must be >= 1, got {global_eval_every!r}")
        if early_stopping_window < 1:
            raise ValueError(f"early_stopping_window must be >= 1, got {early_stopping_window!r}")
        if early_stopping_report not in ("window", "all_clients"):
            raise ValueError(
                "early_stopping_report must be 'window' or 'all_clients', "
                f"got {early_stopping_report!r}"
            )
        self.factory = factory
        self.data = data
        self.rounds = rounds
        self.client_fraction = client_fraction
        self.full_last_round = full_last_round
        self.eval_every = eval_every
        self.global_eval_every = global_eval_every
        self.seed = seed
        self.workers = workers
        self.device = device
        self.callbacks = CallbackList(callbacks)
        self.probes: list[Any] = list(probes or [])
        self.algorithm: Algorithm = factory()
        self.algorithm.init_server()
        self.executor = resolve_executor(executor, self.algorithm, device)
        self.executor_chunk = executor_chunk
        self.client_states: dict[int, Any] = {
            c: self.algorithm.init_client_state(c) for c in range(data.num_clients)
        }
        self.round = 0  # rounds completed
        self.totals = {"bytes_up": 0.0, "bytes_down": 0.0, "seconds": 0.0}
        #: per client, the bytes it uploaded and received over the run ([up, down]); None when
        #: the run resumed a checkpoint that did not count them (never an undercount)
        self.client_bytes: dict[int, list[float]] | None = {}
        self.history: list[RoundResult] = []
        self._costs: dict[int, dict[str, Any]] | None = None
        self.early_stopping_metric = early_stopping_metric
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_window = early_stopping_window
        self.best_value: float | None = None  # best early-stopping metric (window mean) so far
        self.best_round: int | None = None  # the round that measured it (its window's last)
        self.stopped_early = False
        self._measured: list[tuple[int, float]] = []  # (round, value) of each measuring round
        self.early_stopping_report = early_stopping_report
        alg = self.algorithm
        if self._keeps_best_state and (alg.topology != "server" or not alg.client_evaluation):
            raise ValueError(
                f"early_stopping_report='all_clients' needs clients that measure themselves; "
                f"{alg.name} ({alg.topology}) has no per-client evaluation to run"
            )
        # report all_clients: the state after the best round, and its measurement once taken
        self._best_state: dict[str, Any] | None = None
        self._best_evaluation: dict[str, Any] | None = None

    @property
    def finished(self) -> bool:
        """Whether the run has ended: all its rounds run, or stopped early."""
        return self.round >= self.rounds or self.stopped_early

    # ----------------------------------------------------------------- running
    def run(self) -> dict[str, float | None]:
        """Run the remaining rounds and return the final summary."""
        for _ in self.iter_rounds():
            pass
        summary = self.summary()
        self.callbacks.on_run_end(summary)
        return summary

    def iter_rounds(self) -> Iterator[RoundResult]:
        """Run the remaining rounds, yielding each round's result after its callbacks ran."""
        self.callbacks.on_run_start(
            RunInfo(self.algorithm.name, self.rounds, self.data.num_clients, self.round + 1)
        )
        if self.finished:
            return
        with self._executor() as executor:
            while not self.finished:
                result = self._one_round(executor, self.round + 1)
                self.round += 1
                self.history.append(result)
                self._track_validation(result)
                if self._keeps_best_state and self.best_round == result.round:
                    self._best_state = self._snapshot()
                self.callbacks.on_round_end(result)
                yield result

    @property
    def _keeps_best_state(self) -> bool:
        return (
            self.early_stopping_metric is not None and self.early_stopping_report == "all_clients"
        )

    def _snapshot(self) -> dict[str, Any]:
        """A copy of the state the next round starts from (algorithm and clients)."""
        return copy.deepcopy(
            {
                "round": self.round,
                "algorithm": self.algorithm.state_dict(),
                "client_states": self.client_states,
            }
        )

    @contextlib.contextmanager
    def _executor(self) -> Iterator[Any]:
        """The run's executor, closed after the work, or terminated when it fails or is
        abandoned (a closed round generator included)."""
        executor = make_executor(
            self.factory, self.data, self.workers, self.device, self.executor, self.executor_chunk
        )
        try:
            yield executor
        except BaseException:
            if hasattr(executor, "terminate"):
                executor.terminate()
            raise
        else:
            executor.close()

    def _track_validation(self, result: RoundResult) -> None:
        """Early stopping's bookkeeping after ``result``'s round (see the module docstring)."""
        if self.early_stopping_metric is None:
            return
        value = result.metrics.get(self.early_stopping_metric)
        if value is None or not math.isfinite(value):
            return  # not measured this round: neither a gain nor a check
        self._measured.append((result.round, float(value)))
        if self.early_stopping_window > 1:
            value = window_mean([v for _, v in self._measured[-self.early_stopping_window :]])
        if self.best_value is None or value > self.best_value:
            self.best_value, self.best_round = float(value), result.round
        assert self.best_round is not None
        patience = self.early_stopping_patience * self.rounds
        if result.round - self.best_round > patience and result.round < self.rounds:
            self.stopped_early = True

    def _replay_validation(self) -> None:
        """Rebuild early stopping's state from the history (a checkpoint without it)."""
        self.best_value, self.best_round, self.stopped_early = None, None, False
        self._measured = []
        for h in self.history:
            self._track_validation(h)

    def best_window(self) -> list[int]:
        """The rounds of the best window (``[best_round]`` when the window is 1; ``[]`` before
        anything was tracked)."""
        if self.best_round is None:
            return []
        rounds = [r for r, _ in self._measured]
        end = rounds.index(self.best_round) + 1
        return rounds[max(0, end - self.early_stopping_window) : end]

    def _is_eval_round(self, r: int) -> bool:
        return r % self.eval_every == 0 or r == self.rounds

    def _is_global_eval_round(self, r: int) -> bool:
        every = self.global_eval_every
        return self._is_eval_round(r) and (every is None or r % every == 0 or r == self.rounds)

    def _one_round(self, executor: Any, r: int) -> RoundResult:
        start = time.perf_counter()
        alg = self.algorithm
        rng = np.random.default_rng([self.seed, 0x5A, r])
        force_all = self.full_last_round and r == self.rounds
        ids = alg.sample_clients(r, rng, self.client_fraction, force_all)
        evaluate_now = self._is_eval_round(r)
        alg.begin_round(r, ids)
        tasks, bytes_down = [], 0
        for cid in ids:
            payload = alg.broadcast(r, cid)
            bytes_down += tensor_bytes(payload)
            tasks.append(
                ClientTask(cid, r, payload, self.client_states[cid], evaluate_now, self.seed)
            )
        probe_start = time.perf_counter()
        for probe in self.probes:
            probe.before_round(self, r, tasks)
        probe_seconds = time.perf_counter() - probe_start
        bytes_up, losses, client_s = 0, [], []
        accs: dict[str, list[float]] = {
            k: [] for k in (*CLIENT_ACCURACIES, *VAL_ACCURACIES, *CLIENT_LOSSES)
        }
        extra: dict[str, list[float]] = {k: [] for k in alg.client_metrics}
        per_client: list[tuple[int, float, float, dict[str, float]]] = []
        down = {t.client_id: float(tensor_bytes(t.payload)) for t in tasks}
        for res in executor.map(tasks):
            up = tensor_bytes(res.upload)
            bytes_up += up
            per_client.append((res.client_id, float(up), down[res.client_id], res.metrics))
            if self.client_bytes is not None:
                mine = self.client_bytes.setdefault(res.client_id, [0.0, 0.0])
                mine[0] += float(up)
                mine[1] += down[res.client_id]
            # kept on the CPU whatever the executor produced (checkpoints load anywhere)
            self.client_states[res.client_id] = _on_cpu(res.state)
            alg.accumulate(res)
            losses.append(res.metrics.get("train_loss", math.nan))
            client_s.append(res.metrics.get("client_seconds", math.nan))
            for key, values in (*accs.items(), *extra.items()):
                if key in res.metrics:
                    values.append(res.metrics[key])
        alg.end_round(r)
        server: dict[str, float | None] = {}
        if evaluate_now:
            server = alg.evaluate_server(
                self.data,
                self.client_states,
                torch.device(self.device),
                global_test=self._is_global_eval_round(r),
            )
        seconds = time.perf_counter() - start - probe_seconds
        self.totals["bytes_up"] += bytes_up
        self.totals["bytes_down"] += bytes_down
        self.totals["seconds"] += seconds
        units = alg.comm_units(ids)
        if units is not None:
            self.totals["comm_units"] = self.totals.get("comm_units", 0.0) + units
        metrics: dict[str, float | None] = {
            "round": float(r),
            "clients": float(len(ids)),
            "train_loss": _mean(losses),
            **{k: _mean(v) for k, v in extra.items()},
            **{
                k: _mean(v) if evaluate_now else None
                for k, v in accs.items()
                if k in CLIENT_ACCURACIES
            },
            **{
                k: _mean(v)
                for k, v in accs.items()
                if k in (*VAL_ACCURACIES, *CLIENT_LOSSES) and evaluate_now and v
            },
            "global_accuracy": None,
            **server,
            "round_bytes_up": float(bytes_up),
            "round_bytes_down": float(bytes_down),
            "round_seconds": seconds,
            # compute seconds of the round's clients, summed: round_seconds x workers minus
            # this is what orchestration costs
            "client_seconds": float(np.sum(client_s)),
            **self.totals,
            **alg.privacy_metrics(),
        }
        metrics.update(self._width_metrics(per_client, evaluate_now))
        for probe in self.probes:
            metrics.update(probe.round_metrics(r))
        return RoundResult(r, tuple(ids), metrics, evaluate_now)

    def _width_metrics(
        self, per_client: list[tuple[int, float, float, dict[str, float]]], evaluated: bool
    ) -> dict[str, float]:
        """Under a capacity setting, per capacity cluster (clients of width p_i = p): mean
        bytes up and down per client, and on evaluation rounds the mean client accuracies
        (``accuracy_width_<p>``, ``accuracy_before_width_<p>``) and the worst cluster's
        (``accuracy_worst_width``, ...). Only clusters with a client in the round appear."""
        capacity = self.algorithm.capacity
        if capacity is None or not per_client:
            return {}
        groups: dict[float, list[tuple[float, float, dict[str, float]]]] = {}
        for cid, up, down, m in per_client:
            groups.setdefault(capacity.width(cid), []).append((up, down, m))
        out: dict[str, float] = {}
        for width, rows in sorted(groups.items()):
            label = width_label(width)
            out[f"bytes_up_width_{label}"] = float(np.mean([u for u, _, _ in rows]))
            out[f"bytes_down_width_{label}"] = float(np.mean([d for _, d, _ in rows]))
            if not evaluated:
                continue
            for key in CLIENT_ACCURACIES:
                values = [m[key] for _, _, m in rows if key in m]
                if values:
                    out[f"{key}_width_{label}"] = float(np.mean(values))
        if evaluated:
            for key in CLIENT_ACCURACIES:
                cluster = [v for k, v in out.items() if k.startswith(f"{key}_width_")]
                if cluster:
                    out[f"{key}_worst_width"] = min(cluster)
        return out

    def summary(self) -> dict[str, Any]:
        """Final metrics: the last evaluated round's accuracies and the cumulative totals.

        With early stopping, the accuracies are those of the best-validation round instead (the
        means over the best window's rounds when the window is longer than 1, or with
        ``early_stopping_report="all_clients"`` every client's on the state the best window
        ended with, plus ``evaluated_clients``: :meth:`best_state_evaluation`), and
        ``rounds_completed``, ``best_round``, ``best_window_start``, ``early_stopped`` and
        ``best_<metric>`` are added (see the module docstring)."""
        last_eval = next((h for h in reversed(self.history) if h.evaluated), None)
        # A Poisson-sampled round (client-level DP) may have no client: the client accuracies
        # are then those of the last evaluated round that had clients.
        with_clients = next(
            (h for h in reversed(self.history) if h.evaluated and h.client_ids), None
        )
        best = next((h for h in self.history if h.round == self.best_round), None)
        if self.early_stopping_metric is not None and best is not None:
            last_eval = with_clients = best  # the best-validation model is the one reported
        width_keys = (
            {
                k: v
                for k, v in with_clients.metrics.items()
                if k.startswith(CLIENT_ACCURACIES) and "_width" in k
            }
            if with_clients
            else {}
        )
        client_accs = {
            k: with_clients.metrics.get(k) if with_clients else None for k in CLIENT_ACCURACIES
        }
        global_acc = last_eval.metrics.get("global_accuracy") if last_eval else None
        window = self.best_window() if self.early_stopping_metric is not None else []
        if len(window) > 1:  # the best window's means (module docstring)
            rows = [h.metrics for h in self.history if h.round in window and h.evaluated]
            client_accs = {k: _window_mean(rows, k) for k in CLIENT_ACCURACIES}
            global_acc = _window_mean(rows, "global_accuracy")
            keys = {k for m in rows for k in m if k.startswith(CLIENT_ACCURACIES) and "_width" in k}
            width_keys = {
                k: _window_mean(rows, k) for k in sorted(keys) if not k.endswith("_worst_width")
            }
            for key in CLIENT_ACCURACIES:
                cluster = [v for k, v in width_keys.items() if k.startswith(f"{key}_width_")]
                if cluster:
                    width_keys[f"{key}_worst_width"] = min(v for v in cluster if v is not None)
        evaluation = self.best_state_evaluation()
        if evaluation is not None:  # every client on the best state (module docstring)
            client_accs = {k: evaluation.get(k) for k in CLIENT_ACCURACIES}
            width_keys = {
                k: v
                for k, v in evaluation.items()
                if k.startswith(CLIENT_ACCURACIES) and "_width" in k
            }
            global_acc = evaluation["global_accuracy"]
        out = {
            **client_accs,
            **width_keys,
            "global_accuracy": global_acc,
            "rounds": self.round,
            **self.totals,
            **self.algorithm.privacy_metrics(),
        }
        for key in sorted(self.algorithm.reports - out.keys()):
            # what the algorithm measures on its evaluation rounds (e.g. unseen_accuracy)
            out[key] = last_eval.metrics.get(key) if last_eval else None
        if self.early_stopping_metric is not None:
            out["rounds_completed"] = self.round
            out["best_round"] = self.best_round
            out["best_window_start"] = window[0] if window else None
            out["early_stopped"] = 1.0 if self.stopped_early else 0.0
            out[f"best_{self.early_stopping_metric}"] = self.best_value
            if evaluation is not None:
                out["evaluated_clients"] = evaluation["clients"]
        for probe in self.probes:
            out.update(probe.summary(self))
        return out

    def evaluate_clients(self, client_ids: list[int] | None = None) -> dict[str, Any]:
        """Every client's accuracies from the current state (or those of ``client_ids``): each
        runs the evaluated local update that round ``self.round + 1`` would run for it (its
        broadcast, its private state, its local stream), and nothing is aggregated.

        A round's accuracies are means over its sampled clients (a fifth of them under
        Pa3dFL's protocol), so a run's figure is a mean over a window of rounds (the module
        docstring); this measures all of them on one state, as a paper's final "mean test
        accuracy over clients" does. The engine is left as it was: the algorithm's state is
        restored from a copy (its checkpoint contract), the clients train on copies of their
        states, and nothing is logged, counted or checkpointed. Like every round's client
        accuracies, the figures sit outside any privacy accounting (nothing is released).

        Returns ``clients`` (how many), ``round`` (the round whose streams they used), the
        means over clients of :data:`CLIENT_ACCURACIES`, :data:`VAL_ACCURACIES`,
        :data:`CLIENT_LOSSES` and the algorithm's ``client_metrics`` (each over the clients
        reporting it), under a capacity setting the per-cluster means and worst
        cluster (``accuracy_width_<p>``, ``accuracy_worst_width``, ...), and ``per_client``:
        one row per client (``client`` and its accuracies, with ``width`` under a capacity
        setting).

        Raises ValueError for an algorithm whose clients do not measure themselves (the meta
        family's server adapts on every client already) or that is not server-based, and for
        an unknown client id.
        """
        alg = self.algorithm
        if alg.topology != "server" or not alg.client_evaluation:
            raise ValueError(
                f"{alg.name} ({alg.topology}) measures its clients on the server "
                "(evaluate_server): there is no per-client evaluation to run"
            )
        n = self.data.num_clients
        ids = list(range(n)) if client_ids is None else sorted({int(c) for c in client_ids})
        bad = [c for c in ids if not 0 <= c < n]
        if bad or not ids:
            raise ValueError(f"client ids must be in [0, {n}), got {bad or 'none'}")
        r = self.round + 1
        saved = copy.deepcopy(alg.state_dict())
        try:
            with self._executor() as executor:
                alg.begin_round(r, ids)
                tasks = [
                    ClientTask(
                        cid,
                        r,
                        alg.broadcast(r, cid),
                        copy.deepcopy(self.client_states[cid]),
                        True,
                        self.seed,
                    )
                    for cid in ids
                ]
                results = sorted(executor.map(tasks), key=lambda res: res.client_id)
        finally:
            alg.load_state_dict(saved)
        keys = (*CLIENT_ACCURACIES, *VAL_ACCURACIES, *CLIENT_LOSSES, *alg.client_metrics)
        rows = []
        for res in results:
            row: dict[str, Any] = {"client": res.client_id}
            if alg.capacity is not None:
                row["width"] = alg.capacity.width(res.client_id)
            row.update({k: float(res.metrics[k]) for k in keys if k in res.metrics})
            rows.append(row)
        out: dict[str, Any] = {"clients": len(rows), "round": r}
        for key in keys:
            out[key] = _mean([row[key] for row in rows if key in row])
        widths = self._width_metrics([(row["client"], 0.0, 0.0, row) for row in rows], True)
        out.update({k: v for k, v in widths.items() if not k.startswith("bytes_")})
        out["per_client"] = rows
        return out

    def best_state_evaluation(self) -> dict[str, Any] | None:
        """Under ``early_stopping_report="all_clients"``, once the run has ended: the state the
        best window ended with, measured on every client (:meth:`evaluate_clients`'s figures,
        ``per_client`` included, from the streams of the round after the best) and by the
        server (``global_accuracy``, None where the algorithm has no global model). Measured
        once and kept; the engine's own state is left as it was.

        None under ``report: window``, before the run has ended, or without a best round (no
        validation measured)."""
        if not (self._keeps_best_state and self.finished and self._best_state is not None):
            return None
        if self._best_evaluation is None:
            best = self._best_state
            self.callbacks.on_stage(
                f"measuring every client ({self.data.num_clients}) on the state after round "
                f"{best['round']}, the best validation window's last"
            )
            now_round, now_clients = self.round, self.client_states
            now_algorithm = copy.deepcopy(self.algorithm.state_dict())
            try:
                self.round = int(best["round"])
                self.algorithm.load_state_dict(copy.deepcopy(best["algorithm"]))
                self.client_states = best["client_states"]
                out = self.evaluate_clients()
                server = self.algorithm.evaluate_server(
                    self.data, copy.deepcopy(self.client_states), torch.device(self.device)
                )
                out["global_accuracy"] = server.get("global_accuracy")
            finally:
                self.round, self.client_states = now_round, now_clients
                self.algorithm.load_state_dict(now_algorithm)
            self._best_evaluation = out
        return self._best_evaluation

    def client_costs(self) -> dict[int, dict[str, Any]]:
        """Per client under a capacity setting: its capacity ratio and width, the parameters,
        FLOPs of one training batch and peak memory of one training step of the network it
        trains (flcore.models.cost), measured once per distinct width on a batch of the first
        such client's own records, and the bytes it uploaded and received so far
        (``bytes_up``, ``bytes_down``; absent when a resumed checkpoint did not count them).
        Empty without a capacity setting."""
        capacity = self.algorithm.capacity
        if capacity is None:
            return {}
        if self._costs is None:
            from flcore.data import normalize
            from flcore.models.cost import training_cost

            alg, by_width, costs = self.algorithm, {}, {}
            batch = alg.training.batch_size
            for cid in range(self.data.num_clients):
                width = alg.client_width(cid)
                if width not in by_width:
                    records = self.data.client_train(cid)
                    x = normalize(records.images[:batch], self.data.info).to(self.device)
                    y = records.labels[:batch].to(self.device)
                    with torch.random.fork_rng(devices=[]):
                        by_width[width] = training_cost(alg.cost_model(cid), x, y)
                costs[cid] = {
                    "capacity": capacity.ratios[cid],
                    "capacity_width": capacity.width(cid),
                    "trained_width": width,
                    **by_width[width],
                }
            self._costs = costs
        if self.client_bytes is None:
            return self._costs
        return {
            cid: cost
            | dict(
                zip(("bytes_up", "bytes_down"), self.client_bytes.get(cid, [0.0, 0.0]), strict=True)
            )
            for cid, cost in self._costs.items()
        }

    def cost_metrics(self) -> dict[str, float]:
        """:meth:`client_costs` per capacity cluster: ``params_width_<p>``,
        ``flops_width_<p>``, ``peak_memory_width_<p>`` (bytes)."""
        out: dict[str, float] = {}
        for c in self.client_costs().values():
            label = width_label(c["capacity_width"])
            out[f"params_width_{label}"] = float(c["params"])
            out[f"flops_width_{label}"] = float(c["flops"])
            out[f"peak_memory_width_{label}"] = float(c["peak_memory_bytes"])
        return out

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The whole experiment state: server, clients' private states, counters, history."""
        return {
            "version": CHECKPOINT_VERSION,
            "round": self.round,
            "algorithm_name": self.algorithm.name,
            "algorithm": self.algorithm.state_dict(),
            "client_states": self.client_states,
            "totals": dict(self.totals),
            "client_bytes": None if self.client_bytes is None else dict(self.client_bytes),
            "history": [(h.round, h.client_ids, h.metrics, h.evaluated) for h in self.history],
            "probes": [p.state_dict() for p in self.probes],
            "early_stopping": {
                "metric": self.early_stopping_metric,
                "window": self.early_stopping_window,
                "best_value": self.best_value,
                "best_round": self.best_round,
                "stopped_early": self.stopped_early,
                "report": self.early_stopping_report,
                "best_state": self._best_state,
                "best_evaluation": self._best_evaluation,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` so that the next round is exactly the one that was next."""
        if state.get("version") != CHECKPOINT_VERSION:
            raise ValueError(
                f"checkpoint version {state.get('version')} is not {CHECKPOINT_VERSION}"
            )
        if state["algorithm_name"] != self.algorithm.name:
            raise ValueError(
                f"checkpoint is of {state['algorithm_name']!r}, not {self.algorithm.name!r}"
            )
        self.round = int(state["round"])
        self.algorithm.load_state_dict(state["algorithm"])
        self.client_states = dict(state["client_states"])
        self.totals = dict(state["totals"])
        counted = state.get("client_bytes")  # absent from checkpoints of older code
        self.client_bytes = (
            None if counted is None else {int(c): list(b) for c, b in counted.items()}
        )
        self.history = [RoundResult(*h) for h in state["history"]]
        for probe, probe_state in zip(self.probes, state.get("probes", []), strict=False):
            probe.load_state_dict(probe_state)
        stopping = state.get("early_stopping")
        same = (
            stopping is not None
            and stopping.get("metric") == self.early_stopping_metric
            and stopping.get("window", 1) == self.early_stopping_window
        )
        # the tracked rule replays from the history; a checkpoint that tracked the same rule
        # keeps its own word on stopping (so does every checkpoint of this version)
        self._replay_validation()
        if same:
            assert stopping is not None
            self.best_value = stopping["best_value"]
            self.best_round = stopping["best_round"]
            self.stopped_early = bool(stopping["stopped_early"])
        self._best_state = self._best_evaluation = None
        if same and self._keeps_best_state and stopping.get("report") == "all_clients":
            assert stopping is not None
            self._best_state = stopping.get("best_state")
            self._best_evaluation = stopping.get("best_evaluation")
        if self._keeps_best_state and self._best_state is None and self.best_round is not None:
            warnings.warn(
                f"the checkpoint (round {self.round}) holds no best-validation state (it was "
                f"written under early_stopping.report: window): unless a later round improves "
                f"on round {self.best_round}, the run reports its best window's means",
                stacklevel=2,
            )

    def save_checkpoint(self, path: str | Path) -> Path:
        """Write the state to ``path`` atomically (a crash never leaves a half file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(self.state_dict(), tmp)
        tmp.replace(path)
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore from :meth:`save_checkpoint`'s file, whichever device wrote it.

        A run checkpointed on a GPU resumes on a CPU (every tensor to the CPU) or on another GPU
        (the GPU's tensors to this engine's); a CPU checkpoint's tensors stay on the CPU, as
        the algorithms keep some of their state there on any device (a resumed GPU run moves
        the rest as it uses it).
        """
        target = torch.device(self.device)
        where: str | dict[str, str] = "cpu"
        if target.type != "cpu":
            where = {f"cuda:{i}": str(target) for i in range(max(torch.cuda.device_count(), 1))}
        self.load_state_dict(torch.load(Path(path), weights_only=False, map_location=where))


def checkpoint_round(path: str | Path) -> int:
    """The last round a :meth:`Engine.save_checkpoint` file holds."""
    return int(torch.load(Path(path), weights_only=False, map_location="cpu")["round"])
