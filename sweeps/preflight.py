"""Checks a sweep runs before any work: the tracking store is a store and answers, and on a
cluster every node sees the storage path.

Each failure is a :class:`~flcore.errors.ConfigError` naming the key (the CLI exits 2 with it),
raised before the sweep writes its record, creates an MLflow run or starts a trial, so a sweep
refused here leaves nothing behind and can be started again under the same name.

- ``check_tracking_uri``: the URI's scheme is one MLflow reads (``http(s)``, ``file``,
  ``databricks``, or an SQLAlchemy database URL of sqlite, postgresql, mysql or mssql) and a
  database URL's driver imports. ``postgres://`` (Heroku's spelling, which SQLAlchemy 2 dropped)
  is named as such. A URL with a password is refused in the spec, which is logged and kept.
- ``check_tracking_reachable``: a tracking server answers ``GET /health``; a database server
  accepts a connection; a sqlite file's folder can be created. Timeouts are short (5 s): a
  server that is down at the start is a mistake to report, not to wait out (the background
  writer's retries are for a server that goes away mid-sweep, ``sweeps.mlflow_writer``).
- ``check_storage_shared``: on a cluster the driver writes a marker file with a random token
  under ``storage.path`` and one zero-CPU task pinned to each node that can run trials reads it.
  A node that cannot read the token does not share the path (Tune's checkpoints and the Optuna
  journal would silently diverge there), and the error names its address.
"""

from __future__ import annotations

import secrets
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from flcore.errors import ConfigError

__all__ = [
    "refuse_password",
    "require_driver",
    "check_storage_shared",
    "check_tracking_reachable",
    "check_tracking_uri",
    "marker_token",
]

_SERVER_SCHEMES = ("http", "https", "databricks")
_DB_BACKENDS = ("sqlite", "postgresql", "mysql", "mssql")
TIMEOUT = 5.0


def _db_url(uri: str) -> Any | None:
    """The SQLAlchemy URL of a database tracking URI, else None."""
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if scheme.split("+", 1)[0] not in _DB_BACKENDS:
        return None
    from sqlalchemy.engine import make_url

    return make_url(uri)


def check_tracking_uri(uri: str, *, key: str = "tracking.uri", in_spec: bool = True) -> str:
    """``uri`` checked (see the module's docstring); returns it unchanged."""
    if "://" not in uri:
        return uri  # a local folder (MLflow's file store), made absolute by the resolver
    scheme = uri.split("://", 1)[0].lower()
    base = scheme.split("+", 1)[0]
    if base == "postgres":
        raise ConfigError(
            key,
            f"{uri.split('://', 1)[0]}:// is not a scheme SQLAlchemy (and so MLflow) reads: "
            "write postgresql:// (or postgresql+psycopg2://)",
        )
    if scheme == "file" or scheme in _SERVER_SCHEMES:
        return uri
    if base not in _DB_BACKENDS:
        raise ConfigError(
            key,
            f"MLflow cannot store runs at a {scheme}:// URI: use http(s):// for a tracking "
            f"server (fedsweep server), or a database URL ({', '.join(_DB_BACKENDS)})",
        )
    from sqlalchemy.exc import ArgumentError

    try:
        url = _db_url(uri)
    except ArgumentError as err:
        raise ConfigError(key, f"not a database URL: {err}") from None
    if in_spec:
        refuse_password(url, key, "or set the whole URL in MLFLOW_TRACKING_URI")
    require_driver(url, key)
    return uri


def refuse_password(url: Any, key: str, instead: str = "") -> None:
    """A database URL written in the spec may carry no password: the spec is logged to MLflow
    and kept beside the sweep."""
    if url.password is not None:
        raise ConfigError(
            key,
            "the URL carries a password, which would be logged with the spec: leave it out and "
            "give it to the driver (PGPASSWORD or ~/.pgpass for postgresql, ~/.my.cnf for mysql)"
            + (f", {instead}" if instead else ""),
        )


def require_driver(url: Any, key: str) -> None:
    """The database driver a URL names imports now (not after Ray started)."""
    from sqlalchemy.exc import NoSuchModuleError

    try:
        url.get_dialect().import_dbapi()
    except (ImportError, NoSuchModuleError) as err:
        raise ConfigError(
            key,
            f"{url.drivername!r} needs a database driver that is not installed ({err}): install "
            "it (psycopg[binary] for postgresql, mysqlclient for mysql) or name an installed one "
            "in the URL (postgresql+psycopg2://...)",
        ) from None


def check_tracking_reachable(uri: str, *, key: str = "tracking.uri") -> None:
    """The store at ``uri`` answers now (see the module's docstring)."""
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else "file"
    shown = _hide_password(uri)
    if scheme in ("http", "https"):
        health = uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(health, timeout=TIMEOUT) as reply:
                if reply.status != 200:
                    raise OSError(f"GET /health answered {reply.status}")
        except (OSError, urllib.error.URLError) as err:
            raise ConfigError(
                key,
                f"the MLflow tracking server at {shown} does not answer ({_reason(err)}): start "
                "it (fedsweep server ...), or check the host, the port and --allowed-hosts",
            ) from None
        return
    url = _db_url(uri)
    if url is None:
        return  # file:// and databricks: nothing to reach before MLflow does
    if url.get_backend_name() == "sqlite":
        folder = Path(url.database or ".").expanduser().resolve().parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ConfigError(
                key, f"cannot create the sqlite store's folder {folder}: {err}"
            ) from None
        return
    import sqlalchemy

    connect_args = {"connect_timeout": int(TIMEOUT)} if url.get_backend_name() != "mssql" else {}
    engine = sqlalchemy.create_engine(url, connect_args=connect_args, poolclass=_null_pool())
    try:
        with engine.connect():
            pass
    except Exception as err:  # the driver's own errors: refused, unknown host, bad login, ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(
            key, f"cannot connect to the tracking database {shown}: {first}"
        ) from None
    finally:
        engine.dispose()


def _null_pool() -> Any:
    from sqlalchemy.pool import NullPool

    return NullPool


def _hide_password(uri: str) -> str:
    url = _db_url(uri) if "://" in uri else None
    if url is not None and url.password is not None:
        return url.render_as_string(hide_password=True)
    return uri


def _reason(err: BaseException) -> str:
    reason = getattr(err, "reason", None)
    return str(reason if reason is not None else err)


def marker_token() -> str:
    return secrets.token_hex(16)


def _read_marker(path: str) -> tuple[str, str | None]:
    import ray

    try:
        text: str | None = Path(path).read_text()
    except OSError:
        text = None
    return ray.util.get_node_ip_address(), text


def check_storage_shared(root: Path, *, timeout: float = 120.0) -> list[str]:
    """On the connected Ray cluster, every alive node with CPUs reads a marker file the driver
    writes under ``root``; raises naming ``storage.path`` and the nodes that cannot. Returns
    the addresses of the nodes checked."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    root.mkdir(parents=True, exist_ok=True)
    token = marker_token()
    marker = root / f".fedsweep-shared-{token[:8]}"
    marker.write_text(token)
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) > 0]
        read = ray.remote(num_cpus=0, max_retries=0)(_read_marker)
        refs = [
            read.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote(str(marker))
            for n in nodes
        ]
        try:
            seen = ray.get(refs, timeout=timeout)
        except Exception as err:
            raise ConfigError(
                "storage.path", f"could not check that every node sees {root}: {err}"
            ) from None
    finally:
        marker.unlink(missing_ok=True)
    blind = sorted(ip for ip, text in seen if text != token)
    if blind:
        raise ConfigError(
            "storage.path",
            f"{root} is not shared with the cluster: the node(s) at {', '.join(blind)} cannot "
            "read the marker file the driver wrote there. Trials keep their checkpoints and the "
            "Optuna journal there, so every node must mount it at the same path (NFS or the "
            "like; sweeps/cluster/README.md)",
        )
    return sorted(ip for ip, _ in seen)
