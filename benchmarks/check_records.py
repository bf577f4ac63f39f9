"""Does today's code reproduce a committed record? The first rounds again, compared.

A record (``benchmarks/records/<script>/<run>.json``, benchmarks/_runs.py) keeps the config its
run ran, every field, and the training loss of every round. This rebuilds the engine from that
config (``data_root`` and ``workers`` from here: where the data lies and how many processes run
are not the computation), runs its first ``--rounds`` rounds, and compares each round's
``train_loss`` with the record's to the 6 significant digits a record keeps. A run is
deterministic on the CPU for its seed, so a record that differs was made by other code or in
another environment than today's (session 44 found three such LoDMeta records this way).

Prints one JSON object: per record, the rounds compared, the first differing round (None: the
same) and the (record, now) pairs; exits 1 if any record differs, 2 (before any run) on a
file that is not a record. Needs flcore only.

    .venv/bin/python benchmarks/check_records.py benchmarks/records/lodmeta/*-s0.json --rounds 3
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import code_version, machine  # noqa: E402

#: a record keeps 6 significant digits (``_runs._short``): two values agree within this
REL_TOL = 5e-6


def same(recorded: float | None, now: float | None) -> bool:
    """Whether a recorded value and today's agree to the record's precision."""
    if recorded is None or now is None:
        return recorded is None and now is None
    if not (math.isfinite(recorded) and math.isfinite(now)):
        return str(recorded) == str(now)
    return math.isclose(recorded, now, rel_tol=REL_TOL, abs_tol=1e-12)


def _loss(value: Any) -> float | None:
    """A logged loss: a number, or ``"inf"``/``"nan"`` as JSON writes them."""
    return None if value is None else float(value)


def load(path: Path) -> dict[str, Any]:
    """The record at ``path``. Raises ValueError: not a record with a training-loss curve."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(doc, dict) or not {"config", "curve"} <= set(doc):
        raise ValueError(f"{path}: not a benchmark record (no config and curve)")
    if "train_loss" not in doc["curve"]["columns"]:
        raise ValueError(f"{path}: the record's curve has no train_loss")
    return doc


def check(path: Path, doc: dict[str, Any], rounds: int) -> dict[str, Any]:
    """The first ``rounds`` rounds of the record ``doc`` (read from ``path``) again, against
    its curve."""
    import torch

    from flcore.config import ExperimentConfig
    from flcore.experiment import build_engine

    columns, rows = doc["curve"]["columns"], doc["curve"]["rows"]
    recorded = {int(r[0]): _loss(r[columns.index("train_loss")]) for r in rows}
    config = doc["config"] | {"data_root": None, "workers": 1}
    cfg = ExperimentConfig.model_validate(config)
    n = min(rounds, cfg.rounds, len(recorded))
    torch.set_num_threads(1)
    engine = build_engine(cfg)
    pairs: list[tuple[float | None, float | None]] = []
    it = engine.iter_rounds()
    try:
        for result in it:
            pairs.append((recorded.get(result.round), _loss(result.metrics.get("train_loss"))))
            if len(pairs) >= n:
                break
    finally:
        it.close()
    first = next((i + 1 for i, (a, b) in enumerate(pairs) if not same(a, b)), None)
    return {
        "record": str(path),
        "rounds_compared": len(pairs),
        "first_differing_round": first,
        "pairs": pairs,
        "record_code": doc.get("code"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+", type=Path)
    ap.add_argument("--rounds", type=int, default=3, help="rounds to rerun and compare")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    docs = []
    for path in args.records:  # every record is read before any run
        if not path.is_file():
            ap.error(f"no such record: {path}")
        try:
            docs.append(load(path))
        except ValueError as exc:
            ap.error(str(exc))
    results = [check(path, doc, args.rounds) for path, doc in zip(args.records, docs, strict=True)]
    print(
        json.dumps(
            {"machine": machine(), "code": code_version(), "records": results},
            indent=1,
            default=str,
        )
    )
    return 1 if any(r["first_differing_round"] is not None for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
