"""Shared fixtures. `kafka_bootstrap` gives every Kafka test a real broker, or fails it.

Order: $KAFKA_BOOTSTRAP_SERVERS; testcontainers when a Docker engine answers; else the
embedded local broker (Maven jars, KRaft) started once per session in a temp dir. There is no
skip: a Kafka test that cannot get a broker fails with the reason, so CI cannot pass without
really talking to Kafka.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from schemas.kafka_config import KafkaSettings
from surplus import localkafka

KAFKA_IMAGE = f"apache/kafka:{localkafka.kafka_version()}"  # the embedded broker's release


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


def _start_container(stack: ExitStack) -> str:
    from testcontainers.kafka import KafkaContainer

    container = KafkaContainer(image=KAFKA_IMAGE).with_kraft()
    stack.enter_context(container)
    return str(container.get_bootstrap_server())


def _start_local(stack: ExitStack, tmp_dir: str) -> str:
    localkafka.fetch_jars()
    data_dir = localkafka.Path(tmp_dir) / "kafka"
    info, _ = localkafka.up(port=localkafka.free_port(), data_dir=data_dir)
    stack.callback(localkafka.down, data_dir)
    return info.bootstrap


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    env = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if env:
        yield env
        return
    with ExitStack() as stack:
        reasons = []
        if _docker_answers():
            try:
                yield _start_container(stack)
                return
            except Exception as exc:
                reasons.append(f"testcontainers: {exc}")
        else:
            reasons.append("testcontainers: no Docker engine answers")
        try:
            bootstrap = _start_local(stack, str(tmp_path_factory.mktemp("broker")))
        except Exception as exc:
            reasons.append(f"local broker: {exc}")
            pytest.fail("no Kafka broker for Kafka tests: " + "; ".join(reasons))
        yield bootstrap


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[tuple[KafkaSettings, Path, int]]:
    """A local broker of the test's own, topics applied: for tests that stop and restart it
    (never the session broker). Yields (settings, data dir, port)."""
    from surplus.topics import apply_topics

    localkafka.fetch_jars()
    port = localkafka.free_port()
    data_dir = tmp_path / "kafka"
    localkafka.up(port=port, data_dir=data_dir)
    try:
        settings = KafkaSettings(bootstrap=f"127.0.0.1:{port}",
                                 prefix=f"o{uuid.uuid4().hex[:6]}.")
        assert apply_topics(settings.confluent(), settings.prefix, partitions_override=2).ok
        yield settings, data_dir, port
    finally:
        localkafka.down(data_dir)


@pytest.fixture
def kafka(kafka_bootstrap: str) -> KafkaSettings:
    """Settings for one test: the session broker and a topic prefix no other test uses."""
    from surplus.topics import apply_topics

    settings = KafkaSettings(bootstrap=kafka_bootstrap, prefix=f"t{uuid.uuid4().hex[:8]}.")
    report = apply_topics(settings.confluent(), settings.prefix, partitions_override=2)
    assert report.ok, report.mismatches
    return settings
