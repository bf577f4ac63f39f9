"""The cluster files in sweeps/cluster/: the `ray up` config and the KubeRay RayCluster parse and
have the structure the README promises (GPU workers, fedsweep installed, telemetry off, token
auth). The `ray up` config is also checked against the JSON schema shipped with the installed Ray.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

CLUSTER = Path(__file__).resolve().parents[2] / "sweeps" / "cluster"
TELEMETRY_OFF = {"RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true"}


def _load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((CLUSTER / name).read_text())
    assert isinstance(doc, dict), f"{name} is not a YAML mapping"
    return doc


@pytest.fixture(scope="module")
def ray_up() -> dict[str, Any]:
    return _load("aws-gpu.yaml")


@pytest.fixture(scope="module")
def kuberay() -> dict[str, Any]:
    return _load("kuberay-cluster.yaml")


# --- ray up (aws-gpu.yaml) -------------------------------------------------------------------


def test_ray_up_provider_and_name(ray_up: dict[str, Any]) -> None:
    assert ray_up["cluster_name"] == "fedsweep"
    assert ray_up["provider"]["type"] == "aws"
    assert ray_up["provider"]["region"]


def test_ray_up_head_is_a_declared_cpu_node_type(ray_up: dict[str, Any]) -> None:
    types = ray_up["available_node_types"]
    assert ray_up["head_node_type"] in types
    head = types[ray_up["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert head["node_config"]["InstanceType"]


def test_ray_up_has_a_gpu_worker_type(ray_up: dict[str, Any]) -> None:
    types = ray_up["available_node_types"]
    workers = {name: t for name, t in types.items() if name != ray_up["head_node_type"]}
    gpu = {name: t for name, t in workers.items() if t["resources"].get("GPU", 0) >= 1}
    assert gpu, "no worker node type declares a GPU in its resources"
    for t in gpu.values():
        assert t["resources"].get("CPU", 0) >= 1
        assert 0 <= t["min_workers"] <= t["max_workers"] <= ray_up["max_workers"]
        assert t["node_config"]["InstanceType"]
    # Every resource count is a non-negative integer, as Ray's schema requires.
    for t in types.values():
        assert all(isinstance(v, int) and v >= 0 for v in t["resources"].values())


def test_ray_up_installs_fedsweep(ray_up: dict[str, Any]) -> None:
    installs = [c for c in ray_up["setup_commands"] if "pip install" in c and "fedsweep" in c]
    assert installs, "setup_commands do not pip install fedsweep"


def test_ray_up_environment_and_token(ray_up: dict[str, Any]) -> None:
    docker = ray_up["docker"]
    assert "2.60.0" in docker["image"]
    env = dict(
        opt.split(None, 1)[1].split("=", 1)
        for opt in docker["run_options"]
        if opt.startswith(("--env ", "-e "))
    )
    assert env.items() >= {**TELEMETRY_OFF, "RAY_AUTH_MODE": "token"}.items()
    assert any(remote.endswith(".ray/auth_token") for remote in ray_up["file_mounts"])


def test_ray_up_matches_rays_schema(ray_up: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    spec = importlib.util.find_spec("ray")  # locates Ray without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("ray is not installed")
    schema_file = Path(spec.submodule_search_locations[0]) / "autoscaler" / "ray-schema.json"
    if not schema_file.is_file():
        pytest.skip("this Ray ships no autoscaler schema")
    jsonschema.validate(ray_up, json.loads(schema_file.read_text()))


# --- KubeRay (kuberay-cluster.yaml) ----------------------------------------------------------


def _containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    return group["template"]["spec"]["containers"]


def test_kuberay_is_a_raycluster(kuberay: dict[str, Any]) -> None:
    assert kuberay["apiVersion"] == "ray.io/v1"
    assert kuberay["kind"] == "RayCluster"
    assert kuberay["metadata"]["name"] == "fedsweep"
    spec = kuberay["spec"]
    assert spec["authOptions"]["mode"] == "token"
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        for container in _containers(group):
            assert spec["rayVersion"] in container["image"]


def test_kuberay_head(kuberay: dict[str, Any]) -> None:
    head = kuberay["spec"]["headGroupSpec"]
    ports = {p["containerPort"] for p in _containers(head)[0]["ports"]}
    assert {6379, 8265, 10001} <= ports
    assert "nvidia.com/gpu" not in _containers(head)[0]["resources"].get("limits", {})


def test_kuberay_has_a_gpu_worker_group(kuberay: dict[str, Any]) -> None:
    groups = kuberay["spec"]["workerGroupSpecs"]
    gpu = [
        g
        for g in groups
        if any(int(c["resources"]["limits"].get("nvidia.com/gpu", 0)) >= 1 for c in _containers(g))
    ]
    assert gpu, "no workerGroupSpec requests nvidia.com/gpu"
    for g in gpu:
        assert g["groupName"]
        assert 0 <= g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
    assert len({g["groupName"] for g in groups}) == len(groups)


def test_kuberay_strings_where_kubernetes_wants_them(kuberay: dict[str, Any]) -> None:
    spec = kuberay["spec"]
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())
        for container in _containers(group):
            env = {e["name"]: e["value"] for e in container["env"]}
            assert all(isinstance(v, str) for v in env.values())
            assert env.items() >= TELEMETRY_OFF.items()


# --- README ----------------------------------------------------------------------------------


def test_readme_points_to_both_files() -> None:
    readme = (CLUSTER / "README.md").read_text()
    for needle in ("aws-gpu.yaml", "kuberay-cluster.yaml", "RAY_AUTH_MODE=token", "--address auto"):
        assert needle in readme


# --- the tracking server in both files ----------------------------------------------------------


def test_ray_up_starts_a_tracking_server_the_driver_logs_to(ray_up: dict[str, Any]) -> None:
    commands = " ".join(ray_up["head_start_ray_commands"])
    assert "fedsweep server" in commands and "--port 5000" in commands
    assert "--artifacts-destination" in commands
    assert "--env MLFLOW_TRACKING_URI=http://127.0.0.1:5000" in ray_up["docker"]["head_run_options"]


def test_kuberay_head_pod_runs_a_tracking_server_the_driver_logs_to(
    kuberay: dict[str, Any],
) -> None:
    head, *others = _containers(kuberay["spec"]["headGroupSpec"])
    servers = [c for c in others if c.get("command") == ["fedsweep", "server"]]
    assert len(servers) == 1
    port = next(p["containerPort"] for p in servers[0]["ports"])
    assert "--artifacts-destination" in servers[0]["args"]
    assert str(port) in servers[0]["args"]
    env = {e["name"]: e["value"] for e in head["env"]}
    assert env["MLFLOW_TRACKING_URI"] == f"http://127.0.0.1:{port}"  # same pod, same network
