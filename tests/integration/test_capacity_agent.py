"""`surplus capacity-agent` as a process, against AWS's metadata mock and a real broker.

AWS: with no metadata service yet the agent logs why and sends nothing, and keeps polling;
once the mock answers, a rebalance recommendation (as a notice, when asked) and then the spot
interruption become PreemptionNotices for that replica, the interruption's deadline being its
instance-action time, each sent once however often the agent polls. Kubernetes: a preStop call
answers with the notice once it is on Kafka, its deadline the grace period; SIGTERM after it
adds nothing and the agent exits cleanly.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from schemas.contract import PreemptionNotice
from schemas.kafka_config import KafkaSettings
from surplus.localkafka import free_port
from tests.integration.harness import Proc, TopicReader
from tests.integration.metadata_mock import MetadataMock
from workers.capacity.decide import rfc3339_ms

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

POOL = "eu1/rank/baseline/a100/opportunistic"


def _agent(kafka: KafkaSettings, tmp_path: Path, name: str, *args: str) -> Proc:
    """An agent for a replica of POOL whose cgroup lends 16 cores, capped at 8 by its flag,
    and which sees no GPU (the 2 configured stand in): the units each notice carries."""
    cgroup = tmp_path / f"{name}-cgroup"
    cgroup.mkdir()
    (cgroup / "cpu.max").write_text("1600000 100000\n")
    return Proc(["capacity-agent", "--worker-id", name, "--pool", POOL,
                 "--accelerator-units", "2", "--cpu-units", "8", "--cgroup", str(cgroup),
                 "--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix, *args],
                tmp_path / f"{name}.log", env={"NVIDIA_VISIBLE_DEVICES": "void"})


def _wait_log(proc: Proc, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.alive(), proc.output()[-2000:]
        if text in proc.output():
            return
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} in the agent's log:\n{proc.output()[-2000:]}")


def _notices(reader: TopicReader, worker_id: str) -> list[PreemptionNotice]:
    return [n for n in reader.events(PreemptionNotice) if n.replicas == [worker_id]]


def test_spot_interruption_and_rebalance_become_notices_once_the_metadata_service_answers(
        kafka: KafkaSettings, tmp_path: Path) -> None:
    port = free_port()
    reader = TopicReader(kafka, "preemption")
    agent = _agent(kafka, tmp_path, "spot-1", "--source", "aws",
                   "--imds-endpoint", f"http://127.0.0.1:{port}", "--poll-s", "0.5",
                   "--on-rebalance", "notice", "--rebalance-deadline-s", "600")
    mock = None
    try:
        # nothing answers at the endpoint yet: a clear line, no notice, and it keeps polling
        _wait_log(agent, f"127.0.0.1:{port} unreachable", 60)
        reader.poll(1.0)
        assert _notices(reader, "spot-1") == []
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 90))
        mock = MetadataMock(tmp_path, ["-a", "terminate", "-t", at, "-d", "3",
                                       "--rebalance-delay-sec", "0"], port=port).start()
        deadline = time.monotonic() + 60
        while len(_notices(reader, "spot-1")) < 2 and time.monotonic() < deadline:
            assert agent.alive(), agent.output()[-2000:]
            reader.poll(0.5)
        rebalance, interruption = _notices(reader, "spot-1")[:2]
        assert rebalance.notice_id.startswith("aws-rebalance-")
        assert 590_000 <= rebalance.deadline_ms - rebalance.ts_ms <= 600_000
        assert interruption.notice_id.startswith("aws-terminate-")
        assert interruption.deadline_ms == rfc3339_ms(at)  # the instance-action time
        for notice in (rebalance, interruption):
            assert (notice.region, notice.pool_id, notice.accelerator) == ("eu1", POOL, "a100")
            assert (notice.accelerator_units, notice.cpu_units) == (2.0, 8.0)
        assert "reads again" in agent.output()
        reader.poll(2.0)  # four more polls of the same documents
        assert len(_notices(reader, "spot-1")) == 2
        assert agent.stop(signal.SIGTERM, 15) == 0
        reader.poll(1.0)  # stopping an EC2 agent is not a reclaim of its replica
        assert len(_notices(reader, "spot-1")) == 2
    finally:
        if mock is not None:
            mock.stop()
        agent.stop()
        reader.close()


def test_prestop_call_gives_the_grace_period_as_notice_and_sigterm_then_exits(
        kafka: KafkaSettings, tmp_path: Path) -> None:
    port = free_port()
    reader = TopicReader(kafka, "preemption")
    agent = _agent(kafka, tmp_path, "pod-1", "--source", "k8s", "--hook-port", str(port),
                   "--grace-s", "20")
    try:
        _wait_log(agent, "termination hook on", 60)
        before = int(time.time() * 1000)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/prestop", timeout=15) as resp:
            answered = json.loads(resp.read())
        assert answered["replicas"] == ["pod-1"]
        reader.poll(1.0)
        (notice,) = _notices(reader, "pod-1")  # on Kafka by the time the hook answered
        assert notice.notice_id == answered["notice_id"]
        assert notice.deadline_ms - notice.ts_ms == 20_000 and notice.ts_ms >= before
        assert agent.stop(signal.SIGTERM, 15) == 0
        reader.poll(1.0)
        assert len(_notices(reader, "pod-1")) == 1  # SIGTERM after preStop: nothing sooner
    finally:
        agent.stop()
        reader.close()
