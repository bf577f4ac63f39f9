"""A sweep on a real multi-host Ray cluster that loses a host mid-sweep.

Three hosts made of Linux namespaces (tests/integration/netns.py: a network namespace on a
bridge, private /tmp and /dev/shm): ``head`` runs ``ray start --head`` (no CPUs), PostgreSQL,
``fedsweep server`` on it (MLflow, proxied artifacts) and the driver; ``w1`` and ``w2`` each run
``ray start`` with one CPU. Every Ray process has token authentication (``RAY_AUTH_MODE=token``)
and binds its host's namespace address. The storage path and the data are folders every host
sees, as NFS would be. The driver runs ``fedsweep sweep --address HEAD:PORT`` against the
tracking server, with its Optuna study in the same PostgreSQL.

Once a trial on ``w1`` has reported, every process of ``w1`` is SIGKILLed (``ip netns pids``).
Its trials are retried on ``w2`` from their checkpoints and the sweep completes: each trial once
in MLflow and in Optuna, nothing RUNNING, trials placed on both workers (``node_ip``), and the
metric history of a moved trial has every round. The algorithm is a plugin package that exists
only in the head host's private /tmp: the trials on the worker hosts know it because the driver
ships it to them (``runtime_env`` ``py_modules``). Needs root (``ip netns``, ``unshare``,
``nsenter``), as CI has; it fails, not skips, without it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.integration.netns import Hosts
from tests.integration.postgres import postgres
from tests.integration.ray_hosts import RAY, Node
from tests.integration.sweep_helpers import FEDSWEEP, env, free_port, tiny_spec, write_spec

ROUNDS = 8

_PROBE = """
import json, sys, urllib.request
from mlflow.tracking import MlflowClient
url, experiment = sys.argv[1], sys.argv[2]
c = MlflowClient(tracking_uri=url)
exp = c.get_experiment_by_name(experiment)
out = []
for r in (c.search_runs([exp.experiment_id], max_results=1000) if exp else []):
    if r.data.tags.get("fedsweep.kind") == "sweep":
        continue
    steps = []
    if len(sys.argv) > 3:
        steps = sorted(m.step for m in c.get_metric_history(r.info.run_id, "accuracy"))
    out.append({"status": r.info.status, "tags": r.data.tags, "steps": steps})
print(json.dumps(out))
"""

#: a plugin package that exists only on the head host (its private /tmp): a trial on a worker
#: host can import it only because the driver ships it (runtime_env py_modules)
_PLUGIN = """
import time

from flcore.algorithms.base import ALGORITHMS
from flcore.algorithms.fedavg import FedAvg
from search_spaces.base import SPACES, param_name


@ALGORITHMS.register("fedavg_headonly")
class FedAvgHeadOnly(FedAvg):
    name = "fedavg_headonly"

    def end_round(self, round):
        time.sleep(1.5)  # a trial outlasts the probe's look at it: the kill lands mid-trial
        super().end_round(round)


@SPACES.register("fedavg_headonly")
def _space(trial, algorithm):
    trial.suggest_float(param_name(algorithm, "lr"), 0.02, 0.05)
"""
_WRITE = (
    "import sys, pathlib; p = pathlib.Path('/tmp/plugins/fsplug'); p.mkdir(parents=True); "
    "(p / '__init__.py').write_text(sys.stdin.read())"
)

_OPTUNA = """
import json, sys, optuna
study = optuna.load_study(study_name=sys.argv[2], storage=sys.argv[1])
print(json.dumps([t.state.name for t in study.trials]))
"""


def _on(hosts: Hosts, name: str, args: list[str], extra: dict[str, str]) -> str:
    out = subprocess.run(
        hosts.run_on(name, args), capture_output=True, text=True, timeout=120, env=extra
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def _wait_health(hosts: Hosts, url: str, server: subprocess.Popen, base: dict[str, str]) -> None:
    code = (
        "import sys, time, urllib.request\n"
        "for _ in range(180):\n"
        "    try:\n"
        "        urllib.request.urlopen(sys.argv[1] + '/health', timeout=2); print('up'); break\n"
        "    except OSError: time.sleep(0.5)\n"
    )
    said = subprocess.run(
        hosts.run_on("head", [sys.executable, "-c", code, url]),
        capture_output=True,
        text=True,
        timeout=120,
        env=base,
    ).stdout
    assert "up" in said, f"the tracking server did not come up (exit {server.poll()})"


@pytest.mark.slow  # the fault-injection tier: `make slow` (README, "Tests")
def test_a_sweep_survives_losing_a_worker_host(fmnist, data_root: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("the multi-host test needs root (ip netns, unshare, nsenter), as CI has")
    home = Path(tempfile.mkdtemp(prefix="fsns-", dir="/var/tmp"))
    shared, data = home / "shared", home / "shared" / "data"
    shutil.copytree(data_root, data)  # the hosts' /tmp is their own: data lives on "NFS"
    token = secrets.token_hex(16)
    base = env() | {"FEDSWEEP_DATA_ROOT": str(data)}
    ray_vars = base | {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    nodes: list[Node] = []
    server = None
    try:
        with Hosts(["head", "w1", "w2"]) as hosts:
            ips = dict(hosts.ip)
            head_ip = hosts.ip["head"]
            with postgres(host=head_ip, wrap=hosts.run_on("head", [])) as pg:
                mport, rport = free_port(), free_port()
                url = f"http://{head_ip}:{mport}"
                server = subprocess.Popen(
                    hosts.run_on(
                        "head",
                        [
                            FEDSWEEP,
                            "server",
                            "--backend-store-uri",
                            f"{pg}/mlflow",
                            "--artifacts-destination",
                            str(shared / "artifacts"),
                            "--host",
                            head_ip,
                            "--port",
                            str(mport),
                            "--workers",
                            "1",
                        ],  # fmt: skip
                    ),
                    env=base,
                    stdout=subprocess.DEVNULL,
                    stderr=(home / "server.log").open("w"),
                )
                head = [
                    RAY, "start", "--head", "--block", f"--node-ip-address={head_ip}",
                    f"--port={rport}", "--num-cpus=0", "--include-dashboard=false",
                    "--disable-usage-stats",
                ]  # fmt: skip
                nodes.append(Node(hosts.run_on("head", head), ray_vars, home / "head.log"))
                _wait_health(hosts, url, server, base)
                address = f"{head_ip}:{rport}"
                for w in ("w1", "w2"):
                    worker = [
                        RAY, "start", "--block", f"--address={address}",
                        f"--node-ip-address={hosts.ip[w]}", "--num-cpus=1",
                    ]  # fmt: skip
                    nodes.append(Node(hosts.run_on(w, worker), ray_vars, home / f"{w}.log"))

                subprocess.run(
                    hosts.run_on("head", [sys.executable, "-c", _WRITE]),
                    input=_PLUGIN,
                    text=True,
                    check=True,
                )
                spec = tiny_spec(
                    data_root,
                    name="hosts",
                    algorithms=["fedavg_headonly"],
                    num_samples=4,
                    max_concurrent_trials=2,
                    max_failures=3,
                    rounds_per_step=1,
                    checkpoint={"every": 1, "keep": 2},
                    tracking={"uri": url, "experiment": "hosts"},
                    storage={"path": str(shared / "sweeps"), "optuna": f"{pg}/optuna"},
                    ray={},
                )
                spec["base"].update(data_root=str(data), rounds=ROUNDS, samples_per_client=300)
                path = write_spec(home, spec)
                driver = subprocess.Popen(
                    hosts.run_on(
                        "head", [FEDSWEEP, "sweep", str(path), "--address", address, "--json"]
                    ),
                    cwd=home,
                    env=ray_vars
                    | {
                        "FEDSWEEP_PLUGINS": "fsplug",
                        "PYTHONPATH": "/tmp/plugins" + os.pathsep + ray_vars["PYTHONPATH"],
                    },
                    stdout=subprocess.PIPE,
                    stderr=(home / "driver.log").open("w"),
                    text=True,
                )
                # once a trial on w1 has reported a round (so it has a checkpoint) and has
                # rounds left (at 1.5 s or more each, several times what this look takes), w1
                # goes down, all of it at once: a trial that had ended, its run not yet closed,
                # would move nothing
                deadline, killed = time.monotonic() + 300, 0
                probe = [sys.executable, "-c", _PROBE, url, "hosts", "steps"]
                while time.monotonic() < deadline and driver.poll() is None:
                    runs = json.loads(_on(hosts, "head", probe, base))
                    if any(
                        r["tags"].get("node_ip") == hosts.ip["w1"]
                        and r["status"] == "RUNNING"
                        and 1 <= max(r["steps"], default=0) <= ROUNDS - 4
                        for r in runs
                    ):
                        killed = hosts.kill("w1")
                        break
                    time.sleep(1)
                assert killed, "no trial ran on w1 before the sweep ended"
                out, _ = driver.communicate(timeout=600)
                log = (home / "driver.log").read_text()
                assert driver.returncode == 0, log[-4000:]
                summary = json.loads(out)

                runs = json.loads(
                    _on(hosts, "head", [sys.executable, "-c", _PROBE, url, "hosts", "steps"], base)
                )
                states = json.loads(
                    _on(
                        hosts,
                        "head",
                        [sys.executable, "-c", _OPTUNA, f"{pg}/optuna", "hosts"],
                        base,
                    )
                )
    finally:
        for node in reversed(nodes):
            node.kill()
        if server is not None and server.poll() is None:
            server.kill()
        shutil.rmtree(home, ignore_errors=True)

    # every trial exactly once, in both stores, nothing left RUNNING
    assert len(runs) == 4 and sorted(states) == ["COMPLETE"] * 4, (runs, states)
    assert [r["status"] for r in runs] == ["FINISHED"] * 4, runs
    assert len({r["tags"]["fedsweep.trial_id"] for r in runs}) == 4
    assert sorted(t["status"] for t in summary["trials"]) == ["FINISHED"] * 4
    # the plugin algorithm, known only on the head host, ran on the worker hosts
    assert {r["tags"]["algorithm"] for r in runs} == {"fedavg_headonly"}
    # trials were placed on both workers
    assert {r["tags"].get("node_ip") for r in runs} == {ips["w1"], ips["w2"]}, runs
    # the trial(s) w1 was running moved to w2 and kept every round of their history
    moved = [r for r in runs if int(r["tags"].get("retries", "0")) >= 1]
    assert moved, [r["tags"] for r in runs]
    for r in runs:
        assert sorted(set(r["steps"])) == list(range(1, ROUNDS + 1)), r["steps"]
    for r in moved:  # resumed from a checkpoint, not from round 1: round 1 was logged once
        assert r["steps"].count(1) == 1, r["steps"]
