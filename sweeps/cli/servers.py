"""``fedsweep ui`` and ``server``: dashboards and the shared tracking server, until Ctrl-C."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from sweeps.cli._app import app
from sweeps.cli.inputs import store_or_fail
from sweeps.cli.output import err_console, fail

__all__ = ["server", "ui"]


@app.command()
def ui(
    port: Annotated[
        int | None, typer.Option(help="port on 127.0.0.1 (MLflow 5000, Optuna 8080)")
    ] = None,
    optuna: Annotated[
        bool, typer.Option("--optuna", help="the Optuna dashboard of a sweep's study instead")
    ] = False,
    spec: Annotated[
        Path | None,
        typer.Option(help="the sweep spec: its tracking store (with --optuna: its study)"),
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            help="--optuna: a storage URL, a store file, or a storage.path folder (default "
            "sweeps_out)"
        ),
    ] = None,
    study: Annotated[str | None, typer.Option(help="--optuna: the study to open")] = None,
) -> None:
    """Serve the MLflow UI (or, with --optuna, the Optuna dashboard) until Ctrl-C.

    It reads the tracking store and listens on 127.0.0.1; on exit the server and its children
    are stopped."""
    from sweeps.dashboards import (
        HOST,
        DashboardError,
        mlflow_ui_command,
        optuna_dashboard_command,
        optuna_target,
        require_free_port,
    )

    if not optuna and (storage or study):
        fail("--storage and --study go with --optuna")
    port = port or (8080 if optuna else 5000)
    try:
        require_free_port(port)
        if optuna:
            target = optuna_target(spec, storage, study)
            cmd, env, url = optuna_dashboard_command(target.storage, port), None, target.url(port)
            what = f"Optuna dashboard ({target.storage})"
        else:
            uri, _ = store_or_fail(spec, None)
            cmd, env = mlflow_ui_command(uri, port)
            url, what = f"http://{HOST}:{port}/", f"MLflow UI ({uri})"
    except DashboardError as exc:
        fail(str(exc))
    serve_until_stopped(cmd, env, what, url, f"http://{HOST}:{port}/", f"ready: {url}")


@app.command()
def server(
    backend_store_uri: Annotated[
        str,
        typer.Option(
            help="the tracking store: postgresql://USER@HOST:5432/DB (the cluster setup; the "
            "same PostgreSQL can hold the Optuna study) or sqlite:///PATH"
        ),
    ],
    artifacts_destination: Annotated[
        str,
        typer.Option(
            help="where the server keeps artifacts (a local path or an object-store URI); "
            "clients upload through the server, so they need no shared path"
        ),
    ],
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 5000,
    allowed_hosts: Annotated[
        str | None,
        typer.Option(
            help="Host headers to accept, comma-separated (MLflow accepts only localhost and "
            "private-range addresses by default), e.g. 'mlflow.lab.org,mlflow.lab.org:5000'"
        ),
    ] = None,
    workers: Annotated[int, typer.Option(help="server worker processes")] = 4,
) -> None:
    """A shared MLflow tracking server for cluster sweeps, until Ctrl-C.

    PostgreSQL backend, proxied artifacts. Sweeps reach it with tracking.uri:
    http://HOST:PORT."""
    from sweeps.dashboards import DashboardError, require_free_port, tracking_server_command

    if "://" not in artifacts_destination:
        Path(artifacts_destination).mkdir(parents=True, exist_ok=True)
        artifacts_destination = str(Path(artifacts_destination).resolve())
    try:
        require_free_port(port, host)
        cmd, env = tracking_server_command(
            backend_store_uri,
            artifacts_destination,
            host=host,
            port=port,
            allowed_hosts=allowed_hosts,
            workers=workers,
        )
    except DashboardError as exc:
        fail(str(exc))
    url = f"http://{host}:{port}"
    ready = f"ready: {url} (tracking.uri: {url})"
    serve_until_stopped(cmd, env, "MLflow tracking server", url, f"{url}/health", ready)


def serve_until_stopped(
    cmd: list[str], env: dict[str, str] | None, what: str, url: str, ready_url: str, ready: str
) -> None:
    """Run a server (sweeps.dashboards.serve) until Ctrl-C, saying when it starts, is ready and
    stops; a server that exits on its own exits 1 with its status."""
    from sweeps.dashboards import serve

    err_console.print(f"starting the {what} on {escape(url)} (Ctrl-C stops it)")
    code = serve(cmd, env=env, ready_url=ready_url, on_ready=lambda: err_console.print(ready))
    if code:
        fail(f"the server exited with status {code}", code=1)
    err_console.print("stopped")
