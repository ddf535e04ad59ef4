"""Metrics endpoints bind loopback unless an operator asks for more: prometheus-client's own
default is every interface, which would publish a process's internals to the network."""

from __future__ import annotations

import pytest

from schemas.kafka_config import KafkaSettings
from streams.settings import ControlPlaneSettings
from surplus.live.scheduler import Scheduler
from surplus.localkafka import free_port
from tests.sockets import listening


@pytest.mark.parametrize("host", [None, "0.0.0.0"])
def test_scheduler_metrics_bind_loopback_by_default_and_elsewhere_only_when_asked(
        host: str | None) -> None:
    port = free_port()
    settings = KafkaSettings(bootstrap="127.0.0.1:1")
    if host is None:
        Scheduler([], settings, 0, metrics_port=port)
    else:
        Scheduler([], settings, 0, metrics_port=port, metrics_host=host)
    assert {addr for addr, p in listening() if p == port} == {host or "127.0.0.1"}


def test_control_plane_metrics_default_to_loopback() -> None:
    assert ControlPlaneSettings().metrics_host == "127.0.0.1"
