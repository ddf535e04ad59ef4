"""One Kafka release everywhere: the embedded broker's jars (the pom), the compose file's broker
and the image the test containers run, so no path tests one Kafka and deploys another."""

from __future__ import annotations

from pathlib import Path

import yaml

from surplus.localkafka import kafka_version
from tests.conftest import KAFKA_IMAGE

ROOT = Path(__file__).resolve().parents[2]


def test_compose_and_test_containers_run_the_pom_kafka_release() -> None:
    version = kafka_version()
    assert version.count(".") == 2, version
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose["services"]["kafka"]["image"] == f"apache/kafka:{version}"
    image = KAFKA_IMAGE
    assert image == f"apache/kafka:{version}"
