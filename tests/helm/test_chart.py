"""The Helm chart renders what Surplus's processes actually read: every SURPLUS_* variable it
sets is an option or setting of that command, its config files load, the pods stop the way the
worker's SIGTERM sequence needs, every issuer of signed messages holds the key, and its
PrometheusRule with default values is the tested rules file.

`make helm-check` runs these after `helm lint` and kubeconform (which check the manifests'
shape, not what Surplus makes of them); $HELM names the helm binary it built.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import typer
import yaml

from schemas.kafka_config import KafkaSettings
from streams.control.config import load_config as load_control_config
from streams.settings import ControlPlaneSettings
from surplus.cli import app
from workers.runtime.config import load_config as load_worker_config

pytestmark = pytest.mark.helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "infra" / "helm" / "surplus"
RULES = ROOT / "infra" / "prometheus" / "rules" / "surplus.rules.yml"
VALUES = {"defaults": None, "everything": CHART / "ci" / "everything-values.yaml"}


def _helm() -> str:
    path = os.environ.get("HELM") or shutil.which("helm")
    if not path:
        pytest.fail("helm not found: `make helm-check` builds it and sets $HELM")
    return path


def _render(values: Path | None) -> list[dict[str, Any]]:
    argv = [_helm(), "template", "surplus", str(CHART), "--kube-version", "1.33.0"]
    if values is not None:
        argv += ["--values", str(values)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(params=sorted(VALUES), scope="module")
def manifests(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return _render(VALUES[request.param])


def _of(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def _containers(manifests: list[dict[str, Any]], kind: str) -> Iterator[dict[str, Any]]:
    for m in _of(manifests, kind):
        pod = m["spec"]["template"]["spec"]
        yield from pod.get("initContainers", [])
        yield from pod["containers"]


def _agent(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The capacity agent of a worker pod: a native sidecar or a plain container."""
    found = [c for c in pod.get("initContainers", []) + pod["containers"]
             if c["name"] == "capacity-agent"]
    assert len(found) <= 1
    return found[0] if found else None


def _options(command: str) -> set[str]:
    group = typer.main.get_group(app)
    ctx = group.make_context("surplus", [], resilient_parsing=True)
    found = group.get_command(ctx, command)
    assert found is not None, command
    return {p.name for p in found.params if p.name}


def _config_files(manifests: list[dict[str, Any]]) -> dict[str, str]:
    (config,) = [m for m in _of(manifests, "ConfigMap")
                 if m["metadata"]["name"].endswith("-config")]
    return dict(config["data"])


def test_every_variable_the_chart_sets_is_read_by_its_command(
        manifests: list[dict[str, Any]]) -> None:
    control = {f"SURPLUS_CONTROL_{o.upper()}" for o in _options("control-plane")} | {
        f"SURPLUS_CONTROL_{f.upper()}" for f in ControlPlaneSettings.model_fields}
    worker = {f"SURPLUS_WORKER_{o.upper()}" for o in _options("worker")}
    agent = {f"SURPLUS_CAPACITY_AGENT_{o.upper()}" for o in _options("capacity-agent")}
    topics = {"SURPLUS_TOPICS_APPLY_PARTITIONS", "SURPLUS_TOPICS_APPLY_REPLICATION_FACTOR"}
    kafka = {f"SURPLUS_KAFKA_{f.upper()}" for f in KafkaSettings.model_fields}
    known = control | worker | agent | topics | kafka | {
        "SURPLUS_LOG_FORMAT", "POD_NAME", "POD_IP", "HOME", "OMP_NUM_THREADS"}
    set_here = {e["name"] for kind in ("StatefulSet", "Deployment", "Job")
                for c in _containers(manifests, kind) for e in c.get("env", [])}
    assert set_here - known == set()
    (kafka_map,) = [m for m in _of(manifests, "ConfigMap")
                    if m["metadata"]["name"].endswith("-kafka")]
    assert set(kafka_map["data"]) <= kafka
    settings = {k.removeprefix("SURPLUS_KAFKA_").lower(): v for k, v in kafka_map["data"].items()
                if not k.startswith("SURPLUS_KAFKA_SSL_")}     # files only the pod has
    if settings["security_protocol"].startswith("SASL"):      # from the referenced Secret
        settings |= {"sasl_username": "from-secret", "sasl_password": "from-secret"}
    KafkaSettings.model_validate(settings)


def test_control_plane_pods_are_named_members_of_the_group(
        manifests: list[dict[str, Any]]) -> None:
    (statefulset,) = _of(manifests, "StatefulSet")
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert container["args"][:3] == ["control-plane", "--instance-id", "$(POD_NAME)"]
    pod_name = next(e for e in container["env"] if e["name"] == "POD_NAME")
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    services = {s["metadata"]["name"]: s for s in _of(manifests, "Service")}
    assert services[statefulset["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"


def test_worker_pods_drain_within_their_grace(
        manifests: list[dict[str, Any]], tmp_path: Path) -> None:
    files = _config_files(manifests)
    deployments = _of(manifests, "Deployment")
    assert deployments
    for deployment in deployments:
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
        if pre_stop[0] == "sleep":
            pause = int(pre_stop[1])
        else:   # tells the capacity agent beside it, then pauses
            agent = _agent(pod)
            assert agent is not None
            agent_env = {e["name"]: e.get("value") for e in agent["env"]}
            hook = f"127.0.0.1:{agent_env['SURPLUS_CAPACITY_AGENT_HOOK_PORT']}/prestop"
            assert hook in pre_stop[2]
            assert agent_env["SURPLUS_CAPACITY_AGENT_WORKER_URL"] == \
                f"http://127.0.0.1:{env['SURPLUS_WORKER_PORT']}"      # notices straight to it
            assert float(agent_env["SURPLUS_CAPACITY_AGENT_GRACE_S"]) == \
                pod["terminationGracePeriodSeconds"]
            pause = int(re.search(r"time\.sleep\((\d+)\)", pre_stop[2]).group(1))  # type: ignore[union-attr]
        name = Path(env["SURPLUS_WORKER_CONFIG"]).name
        path = tmp_path / name
        path.write_text(files[name])
        config = load_worker_config(path, defaults={"worker_id": "w-0"})
        assert pod["terminationGracePeriodSeconds"] >= pause + config.shutdown_grace_s + 1


def test_opportunistic_workers_lend_through_a_native_sidecar_agent(
        manifests: list[dict[str, Any]]) -> None:
    """With no scheduler, what an opportunistic pod lends comes from its capacity agent: beside
    every opportunistic worker (a native sidecar unless the values say otherwise), speaking for
    the worker's pool and replica, lending the worker container's CPU limit (the downward API:
    a sidecar's own cgroup is not the worker's) and the pool's GPU limit as its units."""
    lending = 0
    for deployment in _of(manifests, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        worker = pod["containers"][0]
        worker_env = {e["name"]: e.get("value") for e in worker["env"]}
        pool = worker_env["SURPLUS_WORKER_POOL"]
        agent = _agent(pod)
        if agent is None:
            assert not pool.endswith("/opportunistic"), f"{pool} lends nothing"
            continue
        lending += pool.endswith("/opportunistic")
        env = {e["name"]: e.get("value") for e in agent["env"]}
        assert env["SURPLUS_CAPACITY_AGENT_POOL"] == pool
        assert env["SURPLUS_CAPACITY_AGENT_WORKER_ID"] == worker_env["SURPLUS_WORKER_WORKER_ID"]
        if agent in pod.get("initContainers", []):
            assert agent["restartPolicy"] == "Always"          # a native sidecar
        mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
        (info,) = [v for v in pod["volumes"] if v["name"] == "pod-info"]
        files = {i["path"]: i for i in info["downwardAPI"]["items"]}
        limit = Path(env["SURPLUS_CAPACITY_AGENT_CPU_LIMIT_FILE"])
        assert str(limit.parent) == mounts["pod-info"]
        assert files[limit.name]["resourceFieldRef"] == {
            "containerName": worker["name"], "resource": "limits.cpu", "divisor": "1m"}
        labels = env["SURPLUS_CAPACITY_AGENT_LABELS_FILE"].split()
        assert {Path(f).name for f in labels} <= set(files)
        gpus = (worker["resources"].get("limits") or {}).get("nvidia.com/gpu")
        if gpus is not None:
            assert float(env["SURPLUS_CAPACITY_AGENT_ACCELERATOR_UNITS"]) == float(gpus)
    assert lending


ISSUERS = {"control-plane": "SURPLUS_CONTROL_SIGNING_KEY_FILE",
           "capacity-agent": "SURPLUS_CAPACITY_AGENT_SIGNING_KEY_FILE",
           "worker": "SURPLUS_WORKER_SIGNING_KEY_FILE"}
"""Containers that issue or verify signed control messages, and the variable naming their key."""


def test_with_a_signing_key_every_issuer_signs_with_the_mounted_key() -> None:
    """With ``signingKey.secret`` set, receivers refuse unsigned targets, notices and grants,
    so every container that issues or checks them (the control plane, each worker, each
    capacity agent, whose grants would otherwise be dead-lettered) reads the key from the
    mounted secret; without one none is told of a key."""
    signed = _render(VALUES["everything"])
    seen: set[str] = set()
    pods = [*_containers(signed, "Deployment"), *_containers(signed, "StatefulSet")]
    for container in pods:
        variable = ISSUERS.get(container["name"])
        if variable is None:
            continue
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
        assert variable in env, f"{container['name']} has no signing key"
        assert Path(env[variable]).parent == Path(mounts["signing-key"])
        seen.add(container["name"])
    assert seen == set(ISSUERS)
    unsigned = _render(None)
    for container in [*_containers(unsigned, "Deployment"), *_containers(unsigned, "StatefulSet")]:
        names = {e["name"] for e in container.get("env", [])}
        assert not names & set(ISSUERS.values()), container["name"]


def test_opportunistic_workers_run_in_a_cpu_slice(manifests: list[dict[str, Any]]) -> None:
    """Lent capacity is a real bound: a worker of an opportunistic pool has a CPU limit (its
    grant's slice), so it cannot take more than was lent whatever optional work it is asked."""
    lent = 0
    for deployment in _of(manifests, "Deployment"):
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if not str(env.get("SURPLUS_WORKER_POOL", "")).endswith("/opportunistic"):
            continue
        lent += 1
        limits = container["resources"].get("limits") or {}
        assert "cpu" in limits, f"{deployment['metadata']['name']} has no CPU limit"
    assert lent


def test_the_control_laws_it_mounts_load(manifests: list[dict[str, Any]], tmp_path: Path) -> None:
    text = _config_files(manifests)["control.toml"]
    if text.strip():
        path = tmp_path / "control.toml"
        path.write_text(text)
        load_control_config(path)


def test_the_prometheus_rule_is_the_tested_rules_file(manifests: list[dict[str, Any]]) -> None:
    (rule,) = _of(manifests, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    assert msgspec.json.encode(rule["spec"])     # plain data, nothing templated into it
