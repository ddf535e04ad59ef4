"""The live registry builds each scope's controller from its own config and ticks it on its
own period (``[scopes.<region>]`` overrides, ``ControlConfig.for_scope``)."""

from __future__ import annotations

from streams.control.config import ControlConfig
from streams.scopes import ScopeRegistry

CONFIG = ControlConfig(period_s=10.0, ttl_s=30.0,
                       scopes={"us1": {"period_s": 2.0, "rma": {"sla_p99_ms": 60.0}}})


def test_each_scope_controller_runs_with_its_scope_config() -> None:
    registry = ScopeRegistry(CONFIG)
    us1 = registry.get("us1", 0).controller.config
    eu1 = registry.get("eu1", 1).controller.config
    assert (us1.period_s, us1.rma.sla_p99_ms) == (2.0, 60.0)
    assert (eu1.period_s, eu1.rma.sla_p99_ms) == (10.0, 100.0)


def test_a_scope_is_due_on_its_own_period_not_the_base_one() -> None:
    registry = ScopeRegistry(CONFIG)
    us1, eu1 = registry.get("us1", 0), registry.get("eu1", 1)
    us1.last_tick_ms = eu1.last_tick_ms = 100_000
    assert registry.due(us1, 102_000) and not registry.due(eu1, 102_000)
    assert registry.due(eu1, 110_000)


def test_restored_state_is_rebuilt_with_the_scope_config() -> None:
    donor = ScopeRegistry(CONFIG)
    donor.get("us1", 0)
    stored = donor.save("us1")
    registry = ScopeRegistry(CONFIG)
    registry.stored["us1"] = stored
    assert registry.get("us1", 0).controller.config.period_s == 2.0
