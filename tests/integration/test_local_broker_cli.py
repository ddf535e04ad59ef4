"""`surplus kafka` and `surplus topics` behave as a new user would type them."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from schemas.topics import CATALOG
from surplus import localkafka

pytestmark = pytest.mark.kafka


def _surplus(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "surplus.cli", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_kafka_up_on_a_taken_port_fails_with_one_line_reason(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _surplus("kafka", "up", "--port", str(port), "--data-dir", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: port {port} on 127.0.0.1 is already in use"


def test_kafka_up_without_jars_fails_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    monkeypatch.setenv("SURPLUS_KAFKA_LIBS", str(tmp_path / "nothing"))
    result = _surplus("kafka", "up", "--no-fetch", "--port", str(localkafka.free_port()),
                      "--data-dir", str(tmp_path / "data"))
    assert result.returncode == 1
    assert "Kafka jars missing" in result.stderr


def test_up_topics_apply_status_down_as_typed_by_hand(tmp_path: Path) -> None:
    port = localkafka.free_port()
    data = str(tmp_path / "broker")
    try:
        first = _surplus("kafka", "up", "--port", str(port), "--data-dir", data)
        assert first.returncode == 0, first.stderr
        assert f"127.0.0.1:{port}" in first.stdout
        again = _surplus("kafka", "up", "--port", str(port), "--data-dir", data)
        assert again.returncode == 0 and "already running" in again.stdout
        applied = _surplus("topics", "apply", "--bootstrap", f"127.0.0.1:{port}")
        assert applied.returncode == 0, applied.stderr
        assert applied.stdout.count("created") == len(CATALOG)
        reapplied = _surplus("topics", "apply", "--bootstrap", f"127.0.0.1:{port}")
        assert reapplied.returncode == 0 and reapplied.stdout.count("exists") == len(CATALOG)
        mismatch = _surplus("topics", "apply", "--bootstrap", f"127.0.0.1:{port}",
                            "--partitions", "3")
        assert mismatch.returncode == 1 and "MISMATCH" in mismatch.stderr
        assert _surplus("kafka", "status", "--data-dir", data).returncode == 0
    finally:
        down = _surplus("kafka", "down", "--data-dir", data)
    assert down.returncode == 0 and "stopped" in down.stdout
    assert _surplus("kafka", "status", "--data-dir", data).returncode == 1


def test_a_three_broker_cluster_replicates_topics_and_stops_as_one(tmp_path: Path) -> None:
    port = localkafka.free_port_block(6)
    data = str(tmp_path / "cluster")
    bootstrap = ",".join(f"127.0.0.1:{port + 2 * i}" for i in range(3))
    try:
        first = _surplus("kafka", "up", "--brokers", "3", "--port", str(port), "--data-dir", data,
                         timeout=240)
        assert first.returncode == 0, first.stderr
        assert first.stdout.strip().splitlines()[-1] == bootstrap
        applied = _surplus("topics", "apply", "--bootstrap", bootstrap)
        assert applied.returncode == 0, applied.stderr
        assert applied.stdout.count("(replication factor 3)") == len(CATALOG)
        replicas, min_insync = _replication_of(bootstrap, "surplus.targets")
        assert replicas == {3} and min_insync == "2"
        status = _surplus("kafka", "status", "--data-dir", data)
        assert status.returncode == 0 and status.stdout.count("serving metadata") == 3
        single = _surplus("kafka", "up", "--port", str(port), "--data-dir", data)
        assert single.returncode == 1 and "--brokers 3" in single.stderr
    finally:
        down = _surplus("kafka", "down", "--data-dir", data)
    assert down.returncode == 0 and "cluster stopped" in down.stdout
    stopped = _surplus("kafka", "status", "--data-dir", data)
    assert stopped.returncode == 1 and "not running" in stopped.stdout


def test_kafka_up_refuses_zero_brokers_naming_the_option(tmp_path: Path) -> None:
    result = _surplus("kafka", "up", "--brokers", "0", "--data-dir", str(tmp_path))
    assert result.returncode == 2 and "--brokers" in result.stderr


def _replication_of(bootstrap: str, topic: str) -> tuple[set[int], str]:
    """Replicas per partition of ``topic`` and its min.insync.replicas, as the cluster says."""
    from schemas import kafka_clients

    admin = kafka_clients.admin({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(topic, timeout=10).topics[topic]
    resource = kafka_clients.ConfigResource(kafka_clients.ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    return ({len(p.replicas) for p in meta.partitions.values()},
            configs["min.insync.replicas"].value)
