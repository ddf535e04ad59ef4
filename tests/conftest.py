"""Shared fixtures. `kafka_bootstrap` gives every Kafka test a real broker, or fails it.

Order: $KAFKA_BOOTSTRAP_SERVERS; testcontainers when a Docker engine answers; else the
embedded local broker (Maven jars, KRaft) started once per session in a temp dir. There is no
skip: a Kafka test that cannot get a broker fails with the reason, so CI cannot pass without
really talking to Kafka.

The container is $SURPLUS_KAFKA_IMAGE (default apache/kafka at the embedded broker's release;
`make test-containers` builds surplus-kafka locally) on the host's network, listening on free
127.0.0.1 ports with the embedded broker's settings. SURPLUS_TEST_DOCKER=require (set by `make
test-containers`) fails the Kafka tests when Docker or the container cannot run, rather than
falling back to the embedded broker.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from schemas.kafka_config import KafkaSettings
from surplus import localkafka

KAFKA_IMAGE = os.environ.get("SURPLUS_KAFKA_IMAGE",
                             f"apache/kafka:{localkafka.kafka_version()}")  # the embedded broker's
REQUIRE_DOCKER = os.environ.get("SURPLUS_TEST_DOCKER") == "require"


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


def _container_env(port: int, controller_port: int) -> dict[str, str]:
    """The embedded broker's server.properties as the image's KAFKA_* variables."""
    template = (localkafka.INFRA_DIR / "server.properties.template").read_text()
    config = template.format(port=port, controller_port=controller_port,
                             log_dir="/tmp/kraft-combined-logs")
    env = {"KAFKA_HEAP_OPTS": "-Xms256m -Xmx512m"}
    for line in config.splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split("=", 1)
            name = key.strip().replace("-", "___").replace("_", "__").replace(".", "_").upper()
            env[f"KAFKA_{name}"] = value.strip()
    return env


def _start_container(stack: ExitStack) -> str:
    """A KRaft broker in a container on the host's network (no bridge, no published ports:
    it listens on free 127.0.0.1 ports), removed at the end of the session."""
    from testcontainers.core.container import DockerContainer

    from schemas import kafka_clients

    port, controller_port = localkafka.free_port(), localkafka.free_port()
    container = (DockerContainer(KAFKA_IMAGE, env=_container_env(port, controller_port))
                 .with_kwargs(network_mode="host"))
    stack.enter_context(container)
    bootstrap = f"127.0.0.1:{port}"
    admin = kafka_clients.admin({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 90
    while True:
        try:
            admin.list_topics(timeout=2)
            return bootstrap
        except Exception as exc:
            wrapped = container.get_wrapped_container()
            wrapped.reload()
            if wrapped.status == "exited" or time.monotonic() > deadline:
                logs = wrapped.logs(tail=20).decode(errors="replace")
                raise RuntimeError(f"{KAFKA_IMAGE} did not answer on {bootstrap} "
                                   f"({wrapped.status}): {exc}\n{logs}") from exc
            time.sleep(0.5)


def _start_local(stack: ExitStack, tmp_dir: str) -> str:
    localkafka.fetch_jars()
    data_dir = Path(tmp_dir) / "kafka"
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
                bootstrap = _start_container(stack)
            except Exception as exc:
                if REQUIRE_DOCKER:
                    pytest.fail(f"SURPLUS_TEST_DOCKER=require: testcontainers: {exc}")
                reasons.append(f"testcontainers: {exc}")
            else:
                yield bootstrap
                return
        elif REQUIRE_DOCKER:
            pytest.fail("SURPLUS_TEST_DOCKER=require: no Docker engine answers "
                        f"(DOCKER_HOST={os.environ.get('DOCKER_HOST', 'unset')})")
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
