"""The resolved spec a sweep started with, kept beside its state, and the resume check.

At a sweep's start the driver writes ``<storage.path>/<name>.spec.json``: the resolved spec
(``--set`` applied, the base config inlined, ``data_root`` absolute, and the tracking URI and
experiment as the driver resolved them), its SHA-256, and the Optuna store it chose.
``fedsweep sweep --resume`` compares the spec it is given with that record before Ray starts and
before anything is written, and refuses (a :class:`SpecChangedError`, exit status 2) when a key
that changes results differs, naming every such dotted key with its old and new value.

Decisions:

- Keys that may differ on resume (:data:`RESUME_MAY_DIFFER`): where and how wide the sweep runs
  (``ray.address``, ``ray.num_cpus``, ``ray.num_gpus``, ``max_concurrent_trials``,
  ``resources.*``), so a local sweep can be resumed on a cluster, and ``storage.path``, which
  found the record and so names the same sweep even when written differently (relative, moved).
- ``tracking.uri`` and ``tracking.experiment`` are compared as resolved (a relative sqlite path
  made absolute, ``$MLFLOW_TRACKING_URI`` and ``$MLFLOW_EXPERIMENT_NAME`` applied). They change
  where results go, not the results, but the sweep's parent run and its trials' runs live in the
  first store: a resume elsewhere would split the sweep over two stores (and the parent run id
  kept in the sweep's state does not exist in another store), so a difference is refused.
- ``storage.optuna`` is compared: another store would start a new, empty study.
- The recorded spec is read through today's :class:`SweepSpec` before comparing, so a key added
  to the spec later with a default does not count as a change; a record that no longer
  validates is compared as written.
- A sweep started before records existed has none: it resumes with a warning that its settings
  cannot be checked. A record whose hash does not match its spec was altered: refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from flcore.errors import ConfigError
from sweeps.spec import SweepSpec

__all__ = [
    "RESUME_MAY_DIFFER",
    "SpecChangedError",
    "SpecRecord",
    "check_resume",
    "read_record",
    "resolved_spec",
    "spec_changes",
    "spec_hash",
    "write_record",
]

RECORD_VERSION = 1
RESUME_MAY_DIFFER: tuple[str, ...] = (
    "ray.address",
    "ray.num_cpus",
    "ray.num_gpus",
    "max_concurrent_trials",
    "resources.*",
    "storage.path",
)
_ABSENT = "(absent)"


class SpecChangedError(ConfigError):
    """``--resume`` with settings that differ from the sweep's start; ``changes`` maps each
    differing dotted key to ``(old, new)``."""

    def __init__(self, name: str, record: Path, changes: dict[str, tuple[Any, Any]]) -> None:
        self.changes = changes
        listed = "; ".join(
            f"{k}: {_show(old)} -> {_show(new)}" for k, (old, new) in changes.items()
        )
        super().__init__(
            "--resume",
            f"sweep {name!r} was started with other settings (kept in {record}): {listed}. "
            "Resume with the settings it started with, or start a new sweep under another "
            f"name; only {', '.join(RESUME_MAY_DIFFER)} may differ",
        )


@dataclass(frozen=True)
class SpecRecord:
    """What a sweep started with: its resolved spec, that spec's hash, the Optuna store."""

    spec: dict[str, Any]
    sha256: str
    optuna: str  # 'sqlite', 'journal' or an RDB URL


def resolved_spec(spec: SweepSpec, *, tracking_uri: str, experiment: str) -> dict[str, Any]:
    """The spec as a JSON tree, with the tracking URI and experiment the driver resolved."""
    tree = spec.model_dump(mode="json")
    tree["tracking"] = {**tree["tracking"], "uri": tracking_uri, "experiment": experiment}
    return tree


def spec_hash(tree: dict[str, Any]) -> str:
    """SHA-256 of a spec tree in canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(tree, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def write_record(path: Path, tree: dict[str, Any], optuna: str) -> SpecRecord:
    """Write the record atomically (a reader never sees half a file)."""
    record = SpecRecord(tree, spec_hash(tree), optuna)
    doc = {"version": RECORD_VERSION, "sha256": record.sha256, "optuna": optuna, "spec": tree}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return record


def read_record(path: Path) -> SpecRecord | None:
    """The record at ``path``, or None when there is none.

    Raises:
        ConfigError: the file is unreadable, or its spec does not match its hash.
    """
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
        record = SpecRecord(doc["spec"], doc["sha256"], doc["optuna"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            "--resume", f"cannot read the sweep's spec record {path}: {err}"
        ) from None
    if spec_hash(record.spec) != record.sha256:
        raise ConfigError(
            "--resume",
            f"{path} was altered after the sweep started (its spec does not match its hash)",
        )
    return record


def _normalised(tree: dict[str, Any]) -> dict[str, Any]:
    """A recorded tree read through today's spec model (new keys get their defaults)."""
    try:
        return SweepSpec.model_validate(tree).model_dump(mode="json")
    except ValidationError:
        return tree


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys to leaves; a list of plain values is one leaf (``seeds``), a list holding
    mappings is indexed (``objectives.0.name``)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out |= _flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        out = {}
        for i, v in enumerate(value):
            out |= _flatten(v, f"{prefix}.{i}")
        return out
    return {prefix: value}


def spec_changes(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Every dotted key whose value differs, as ``{key: (old, new)}`` (``(absent)`` where a
    side lacks it), in the order of the new spec, then keys only the old one had."""
    a, b = _flatten(_normalised(old)), _flatten(_normalised(new))
    keys = [*b, *(k for k in a if k not in b)]
    return {
        k: (a.get(k, _ABSENT), b.get(k, _ABSENT))
        for k in keys
        if k not in a or k not in b or a[k] != b[k]
    }


def may_differ(key: str) -> bool:
    return any(fnmatchcase(key, pattern) for pattern in RESUME_MAY_DIFFER)


def check_resume(name: str, path: Path, tree: dict[str, Any]) -> SpecRecord | None:
    """Refuse a resume whose resolved spec ``tree`` differs from the record at ``path`` in a key
    that changes results; warn and return None for a sweep that has no record.

    Raises:
        SpecChangedError: such keys differ (all of them are named).
        ConfigError: the record is unreadable or was altered.
    """
    record = read_record(path)
    if record is None:
        warnings.warn(
            f"sweep {name!r} was started before fedsweep kept a sweep's spec ({path} is "
            "missing): resuming it without checking that its settings are unchanged",
            UserWarning,
            stacklevel=3,
        )
        return None
    if spec_hash(tree) == record.sha256:
        return record
    changes = {k: v for k, v in spec_changes(record.spec, tree).items() if not may_differ(k)}
    if changes:
        raise SpecChangedError(name, path, changes)
    return record


def _show(value: Any) -> str:
    return value if value == _ABSENT else json.dumps(value)
