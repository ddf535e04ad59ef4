"""`surplus capacity-agent` lends its replica's capacity on a real broker, with no scheduler.

EC2 spot (AWS's metadata mock): the agent reads the instance type (g5 -> a10g), its spot
lifecycle and its region from the metadata service, the CPU quota of a cgroup and the GPUs its
runtime shows, and grants that share on the capacity topic, renewed inside its lease; the
control plane's rule (its inventory) counts it. The spot interruption is a notice first and
a revoke after, and nothing is granted again. Kubernetes sidecar: with the pool from a
downward-API labels file and the worker's /readyz, nothing is lent until the worker is ready;
then the control plane process carries the pool on its books, and SIGTERM (the pod's end) is
the notice then the revoke, which the control plane's books follow.
"""

from __future__ import annotations

import itertools
import json
import signal
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from schemas.contract import REPLICA_GRANT_VERSION, CapacityEvent, PreemptionNotice
from schemas.kafka_config import KafkaSettings
from streams.control.inventory import CapacityVector, PoolInventory
from surplus.localkafka import free_port
from tests.integration.fleet import metric, scrape
from tests.integration.harness import Proc, TopicReader
from tests.integration.metadata_mock import MetadataMock

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

LEASE = ["--lease-s", "3", "--renew-s", "1", "--poll-s", "0.5"]


def _cgroup(tmp_path: Path, cpu_max: str) -> Path:
    """A cgroup directory as the agent reads it (cgroup v2 ``cpu.max``)."""
    directory = tmp_path / "cgroup"
    directory.mkdir()
    (directory / "cpu.max").write_text(cpu_max + "\n")
    return directory


def _mine(reader: TopicReader, worker_id: str) -> list[CapacityEvent]:
    return [e for e in reader.events(CapacityEvent) if e.replica == worker_id]


def _wait(what: str, check: Any, timeout_s: float, *procs: Proc) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in procs:
            assert proc.alive(), f"{what}: {proc.log_path.name} died:\n{proc.output()[-3000:]}"
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout_s} s\n"
                         + "\n".join(p.output()[-2000:] for p in procs))


def test_a_spot_instance_lends_its_share_renews_it_and_revokes_it_at_the_interruption(
        kafka: KafkaSettings, tmp_path: Path) -> None:
    config = tmp_path / "aemm.json"
    config.write_text(json.dumps({"metadata": {"values": {
        "instance-type": "g5.xlarge", "instance-life-cycle": "spot",
        "placement-region": "eu-west-1"}}}))
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
    mock = MetadataMock(tmp_path, ["-c", str(config), "-a", "terminate", "-t", at, "-d", "8",
                                   "--rebalance-delay-sec", "600"]).start()
    capacity, preemption = TopicReader(kafka, "capacity"), TopicReader(kafka, "preemption")
    agent = Proc(["capacity-agent", "--worker-id", "spot-7", "--source", "aws",
                  "--imds-endpoint", mock.url, "--cgroup", str(_cgroup(tmp_path, "150000 100000")),
                  *LEASE, "--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix],
                 tmp_path / "agent.log", env={"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"})
    try:
        def revoked() -> bool:
            capacity.poll(0.3)
            return any(e.kind == "revoke" for e in _mine(capacity, "spot-7"))

        _wait("the revoke at the interruption", revoked, 60, agent)
        preemption.poll(1.0)
        capacity.poll(2.0)                       # more ticks: nothing granted after the revoke
        events = _mine(capacity, "spot-7")
        grants = [e for e in events if e.kind == "grant"]
        assert [e.kind for e in events] == ["grant"] * len(grants) + ["revoke"]
        pool = "eu-west-1/rank/baseline/a10g/opportunistic"
        for grant in grants:
            assert (grant.v, grant.region, grant.pool_id, grant.accelerator) == \
                (REPLICA_GRANT_VERSION, "eu-west-1", pool, "a10g")
            assert (grant.accelerator_units, grant.cpu_units) == (2.0, 1.5)  # GPUs, quota
            assert grant.expires_at_ms == grant.ts_ms + 3_000
        stamps = [g.ts_ms for g in grants]
        assert len(grants) >= 4, stamps          # ~8 s of renewals every 1 s (within a tick)
        # each renewal a renew_s after the last, and before that grant's lease ran out
        assert all(1_000 <= b - a < 3_000 for a, b in itertools.pairwise(stamps)), stamps
        (notice,) = [n for n in preemption.events(PreemptionNotice) if n.replicas == ["spot-7"]]
        assert notice.notice_id.startswith("aws-terminate-") and notice.pool_id == pool
        assert (notice.accelerator_units, notice.cpu_units) == (2.0, 1.5)
        revoke = events[-1]
        assert revoke.ts_ms >= notice.ts_ms and revoke.pool_id == pool

        # what the control plane makes of them, in the order the topic holds them
        books = PoolInventory()
        for event in grants:
            books.apply(event)
        assert books.available("eu-west-1", stamps[-1]) == CapacityVector(
            cpu_units=1.5, accel={"a10g": 2.0})
        books.preempt(notice)
        books.apply(revoke)
        assert books.available("eu-west-1", revoke.ts_ms) == CapacityVector()
        assert agent.stop(signal.SIGTERM, 15) == 0
    finally:
        agent.stop()
        mock.stop()
        capacity.close()
        preemption.close()


class _Worker:
    """A worker's /readyz as the agent reads it: 503 until ``ready`` is set, then 200 with
    the pool it serves."""

    def __init__(self, pool_id: str) -> None:
        self.ready = threading.Event()
        self.asked = 0
        worker = self

        class Readyz(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                worker.asked += 1
                ok = worker.ready.is_set()
                body = json.dumps({"status": "ready" if ok else "not_ready",
                                   "pool_id": pool_id}).encode()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Readyz)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def control_plane(kafka: KafkaSettings, tmp_path: Path) -> Iterator[tuple[Proc, int]]:
    port = free_port()
    config = tmp_path / "control.toml"
    config.write_text("period_s = 1.0\nttl_s = 5.0\n")
    proc = Proc(["control-plane", "--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix,
                 "--config", str(config), "--app-id", f"{kafka.prefix}cp", "--partitions", "2",
                 "--data-dir", str(tmp_path / "state"), "--metrics-port", str(port),
                 "--loglevel", "warning"], tmp_path / "control.log")
    try:
        yield proc, port
    finally:
        proc.stop()


def test_a_sidecar_lends_once_its_worker_is_ready_and_sigterm_revokes_it_on_the_books(
        kafka: KafkaSettings, tmp_path: Path, control_plane: tuple[Proc, int]) -> None:
    plane, metrics_port = control_plane
    labels = tmp_path / "labels"
    labels.write_text('app.kubernetes.io/component="worker-powerful"\n'
                      'topology.kubernetes.io/region="eu1"\n'
                      'karpenter.sh/capacity-type="spot"\n'
                      'nvidia.com/gpu.product="NVIDIA-L4"\n')
    pool = "eu1/rank/powerful/l4/opportunistic"
    worker = _Worker(pool)
    capacity, preemption = TopicReader(kafka, "capacity"), TopicReader(kafka, "preemption")
    hook_port = free_port()
    agent = Proc(["capacity-agent", "--worker-id", "pod-1", "--model", "powerful",
                  "--source", "k8s", "--hook-port", str(hook_port), "--grace-s", "20",
                  "--labels-file", str(labels), "--accelerator-units", "1",
                  "--cgroup", str(_cgroup(tmp_path, "50000 100000")),
                  "--worker-url", worker.url, *LEASE,
                  "--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix],
                 tmp_path / "agent.log")

    def books(resource: str) -> float:
        try:
            samples = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
        except OSError:
            return -1.0
        return metric(samples, "surplus_control_opportunistic_units", scope="eu1",
                      resource=resource)

    try:
        _wait("the agent asking its worker", lambda: worker.asked >= 3, 60, agent)
        capacity.poll(1.0)
        assert _mine(capacity, "pod-1") == []               # not ready: nothing lent
        assert "worker not ready" in agent.output()
        worker.ready.set()
        _wait("the control plane's books holding the pool",
              lambda: books("cpu_units") == 0.5 and books("l4") == 1.0, 120, agent, plane)
        capacity.poll(2.5)
        grants = _mine(capacity, "pod-1")
        assert len(grants) >= 2 and {(g.pool_id, g.kind) for g in grants} == {(pool, "grant")}
        assert {(g.accelerator_units, g.cpu_units) for g in grants} == {(1.0, 0.5)}

        assert agent.stop(signal.SIGTERM, 20) == 0          # the pod's end: notice, revoke
        preemption.poll(1.0)
        capacity.poll(1.0)
        (notice,) = [n for n in preemption.events(PreemptionNotice) if n.replicas == ["pod-1"]]
        assert notice.notice_id.startswith("k8s-sigterm-")
        assert notice.deadline_ms - notice.ts_ms == 20_000 and notice.pool_id == pool
        assert _mine(capacity, "pod-1")[-1].kind == "revoke"
        _wait("the control plane's books dropping the pool",
              lambda: books("cpu_units") == 0.0 and books("l4") == 0.0, 30, plane)
    finally:
        agent.stop()
        worker.close()
        capacity.close()
        preemption.close()
