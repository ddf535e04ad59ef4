"""The chart installs on a real Kubernetes API server (etcd and kube-apiserver, built by `make
helm-check` from the Go module proxy; $ETCD and $KUBE_APISERVER name them): the server's own
validation and admission accept every object, with the defaults and with every option on, and
what it stored is what the chart meant (server-side defaults filled in).

No controller manager, scheduler or kubelet runs, so no pod starts: the topics hook (a Job
helm would wait on to complete) is left out with --no-hooks, and nothing here says a worker
serves. What this adds to kubeconform: the server's checks across fields (extended resources'
requests equal to their limits, a native sidecar's restartPolicy, topology spread's
matchLabelKeys against its labelSelector, a budget's selector) and its admission.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.test_chart import CHART, _helm

pytestmark = pytest.mark.helm

VALUES = {"defaults": None, "everything": CHART / "ci" / "everything-values.yaml"}
TOKEN = "surplus-helm-check"
CRDS = ("servicemonitors", "prometheusrules")


def _binary(variable: str) -> str:
    path = os.environ.get(variable)
    if not path or not Path(path).is_file():
        pytest.fail(f"${variable} names no binary: `make helm-check` builds it and sets it")
    return path


def _quantities(value: Any) -> Any:
    """Numbers as the server stores quantities: strings (`nvidia.com/gpu: 1` reads back "1")."""
    if isinstance(value, dict):
        return {k: _quantities(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_quantities(v) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _crds() -> Path:
    """prometheus-operator's CRDs as controller-gen made them for kubeconform ($KUBE_CRDS)."""
    path = Path(os.environ.get("KUBE_CRDS", ""))
    if not (path / "monitoring.coreos.com_servicemonitors.yaml").is_file():
        pytest.fail("$KUBE_CRDS names no CRD folder: `make helm-check` makes it and sets it")
    return path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Api:
    def __init__(self, url: str) -> None:
        self.url = url
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE   # its own self-signed serving certificate

    def call(self, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(
            self.url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, context=self.context, timeout=10) as response:
            return json.loads(response.read() or b"null")


def _wait(what: str, ready: Any, log: Path, process: subprocess.Popen[bytes],
          seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{what} not ready in {seconds:.0f} s (exit {process.poll()}):\n"
                f"{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Path]]:
    etcd, apiserver = _binary("ETCD"), _binary("KUBE_APISERVER")
    root = tmp_path_factory.mktemp("cluster")
    key = root / "sa.key"
    subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True,
                   capture_output=True)
    (root / "tokens.csv").write_text(f"{TOKEN},admin,admin,system:masters\n")
    client, peer, secure = _port(), _port(), _port()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        etcd_log = root / "etcd.log"
        processes.append(subprocess.Popen(
            [etcd, "--data-dir", str(root / "etcd"), "--name", "helm-check",
             "--listen-client-urls", f"http://127.0.0.1:{client}",
             "--advertise-client-urls", f"http://127.0.0.1:{client}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"helm-check=http://127.0.0.1:{peer}",
             "--log-level", "warn"],
            stdout=etcd_log.open("wb"), stderr=subprocess.STDOUT))
        _wait("etcd", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{client}/health", timeout=2).status == 200, etcd_log, processes[0])
        api_log = root / "kube-apiserver.log"
        processes.append(subprocess.Popen(
            [apiserver, "--etcd-servers", f"http://127.0.0.1:{client}",
             "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
             "--secure-port", str(secure), "--cert-dir", str(root / "certs"),
             "--token-auth-file", str(root / "tokens.csv"), "--authorization-mode", "Node,RBAC",
             "--service-account-issuer", "https://kubernetes.default.svc",
             "--service-account-key-file", str(key),
             "--service-account-signing-key-file", str(key),
             "--service-cluster-ip-range", "10.96.0.0/16",
             # no kubernetes Service endpoints: the loopback address may not be one
             "--endpoint-reconciler-type", "none"],
            stdout=api_log.open("wb"), stderr=subprocess.STDOUT))
        api = Api(f"https://127.0.0.1:{secure}")

        def ready() -> bool:
            try:
                api.call("GET", "/api/v1/namespaces/default")
                return True
            except urllib.error.HTTPError:
                return False
        _wait("kube-apiserver", ready, api_log, processes[1])
        kubeconfig = root / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "helm-check",
            "clusters": [{"name": "helm-check", "cluster": {
                "server": api.url, "insecure-skip-tls-verify": True}}],
            "users": [{"name": "admin", "user": {"token": TOKEN}}],
            "contexts": [{"name": "helm-check", "context": {
                "cluster": "helm-check", "user": "admin"}}]}))
        kubeconfig.chmod(0o600)
        crds = _crds()
        for name in CRDS:
            crd = yaml.safe_load((crds / f"monitoring.coreos.com_{name}.yaml").read_text())
            api.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
        # A CRD's status holds "conditions": null until the server has looked at it
        _wait("the prometheus-operator CRDs", lambda: all(
            any(c["type"] == "Established" and c["status"] == "True"
                for c in api.call("GET", f"{path}{n}.monitoring.coreos.com")["status"].get(
                    "conditions") or ()) for n in CRDS), api_log, processes[1])
        yield api, kubeconfig
    finally:
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.mark.parametrize("values", sorted(VALUES))
def test_the_chart_installs_on_an_api_server(cluster: tuple[Api, Path], values: str) -> None:
    api, kubeconfig = cluster
    namespace = f"surplus-{values}"
    argv = [_helm(), "install", "surplus", str(CHART), "--kubeconfig", str(kubeconfig),
            "--namespace", namespace, "--create-namespace", "--no-hooks"]
    if VALUES[values] is not None:
        argv += ["--values", str(VALUES[values])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    rendered = [d for d in yaml.safe_load_all(subprocess.run(
        [_helm(), "get", "manifest", "surplus", "--kubeconfig", str(kubeconfig),
         "--namespace", namespace], capture_output=True, text=True, check=True).stdout) if d]
    assert rendered
    for kind, plural, group in [("Deployment", "deployments", "/apis/apps/v1"),
                                ("StatefulSet", "statefulsets", "/apis/apps/v1"),
                                ("PodDisruptionBudget", "poddisruptionbudgets", "/apis/policy/v1"),
                                ("Service", "services", "/api/v1")]:
        meant = {m["metadata"]["name"]: m for m in rendered if m["kind"] == kind}
        stored = {m["metadata"]["name"]: m for m in api.call(
            "GET", f"{group}/namespaces/{namespace}/{plural}")["items"]}
        assert set(stored) == set(meant), kind
        for name, m in meant.items():
            if kind in ("Deployment", "StatefulSet"):
                pod, kept = m["spec"]["template"]["spec"], stored[name]["spec"]["template"]["spec"]
                for field in ("containers", "initContainers"):
                    assert [(c["name"], c["image"], _quantities(c.get("resources", {})))
                            for c in pod.get(field, [])] == \
                        [(c["name"], c["image"], _quantities(c.get("resources", {})))
                         for c in kept.get(field, [])], name
                for field in ("nodeSelector", "tolerations", "affinity",
                              "topologySpreadConstraints"):
                    assert _quantities(pod.get(field)) == _quantities(kept.get(field)), field
            elif kind == "PodDisruptionBudget":
                assert stored[name]["spec"] == m["spec"]


def test_the_server_refuses_what_kubeconform_passes(cluster: tuple[Api, Path]) -> None:
    """What this test adds: a toleration that says Exists with a value has the schema's shape,
    and the server refuses it."""
    _, kubeconfig = cluster
    bad = '[{"key": "dedicated", "operator": "Exists", "value": "surplus"}]'
    done = subprocess.run(
        [_helm(), "install", "refused", str(CHART), "--kubeconfig", str(kubeconfig),
         "--namespace", "surplus-refused", "--create-namespace", "--no-hooks",
         "--set-json", f"workers.tolerations={bad}"], capture_output=True, text=True, timeout=180)
    assert done.returncode != 0
    assert "value must be empty when `operator` is 'Exists'" in done.stderr, done.stderr
