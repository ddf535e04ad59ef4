"""The control plane's books as a gauge: CPU units apart from a `cpu` accelerator type (a CPU
replica's unit), and a type no longer lent reads 0 rather than its last value."""

from __future__ import annotations

from prometheus_client import generate_latest

from streams.agents.metrics import Metrics
from streams.control.config import ControlConfig
from streams.control.controller import ScopeController
from tests.unit.control.factories import grant


def _books(metrics: Metrics) -> dict[str, float]:
    text = generate_latest(metrics.registry).decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("surplus_control_opportunistic_units{"):
            labels, value = line.rsplit(" ", 1)
            resource = labels.split('resource="', 1)[1].split('"', 1)[0]
            out[resource] = float(value)
    return out


def test_cpu_units_and_a_cpu_replicas_units_are_two_series_and_a_revoke_zeroes_them() -> None:
    metrics, controller = Metrics(), ScopeController("eu1", ControlConfig())
    pool = "eu1/rank/baseline/cpu/opportunistic"
    controller.on_capacity(grant(pool, accel=1.0, cpu=0.5, replica="w1"), 0)
    controller.tick(1_000)
    metrics.observe_controller("eu1", controller)
    assert _books(metrics) == {"cpu_units": 0.5, "cpu": 1.0}
    controller.on_capacity(grant(pool, kind="revoke", ts_ms=2_000, replica="w1"), 2_000)
    controller.tick(3_000)
    metrics.observe_controller("eu1", controller)
    assert _books(metrics) == {"cpu_units": 0.0, "cpu": 0.0}
