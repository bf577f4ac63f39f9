"""The callback protocol: the engine yields per-round results, backends consume them.

Logging backends (MLflow, Ray Tune reports, Parquet, progress bars) live outside flcore and
implement any subset of these methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Callback", "RoundResult", "RunInfo", "CallbackList"]


@dataclass(frozen=True)
class RunInfo:
    """What is known before round 1."""

    algorithm: str
    rounds: int
    num_clients: int
    start_round: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundResult:
    """One round's metrics. ``metrics`` values are floats, or None where not measured this round.

    Keys always present: ``round``, ``clients``, ``train_loss``, ``accuracy`` (after local
    training), ``accuracy_before`` (the models the clients started the round with),
    ``global_accuracy``, ``round_bytes_up``, ``round_bytes_down``, ``round_seconds``,
    ``bytes_up``, ``bytes_down``, ``seconds`` (the last three cumulative over the run), and the
    algorithm's privacy metrics
    (``epsilon``: inf without a DP mechanism, 0 for an algorithm that uploads nothing).
    On evaluation rounds where the clients measure them: ``val_accuracy``,
    ``val_accuracy_before`` and ``test_loss``; on every round the algorithm's
    ``client_metrics`` (None where no client measured them).
    """

    round: int
    client_ids: tuple[int, ...]
    metrics: dict[str, float | None]
    evaluated: bool


class Callback:
    """No-op base; override what you need."""

    def on_run_start(self, info: RunInfo) -> None:
        """Before the first round (also after a restore)."""

    def on_round_end(self, result: RoundResult) -> None:
        """After every round."""

    def on_run_end(self, summary: dict[str, float | None]) -> None:
        """After the last round, with the final summary metrics."""

    def on_stage(self, message: str) -> None:
        """A long step outside the rounds begins (measuring every client on the best state)."""


class CallbackList(Callback):
    """Fans each event out to several callbacks, in order."""

    def __init__(self, callbacks: list[Callback] | None = None) -> None:
        self.callbacks = list(callbacks or [])

    def on_run_start(self, info: RunInfo) -> None:
        for cb in self.callbacks:
            cb.on_run_start(info)

    def on_round_end(self, result: RoundResult) -> None:
        for cb in self.callbacks:
            cb.on_round_end(result)

    def on_run_end(self, summary: dict[str, float | None]) -> None:
        for cb in self.callbacks:
            cb.on_run_end(summary)

    def on_stage(self, message: str) -> None:
        for cb in self.callbacks:
            cb.on_stage(message)
