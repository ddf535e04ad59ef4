"""The rulebook: scope of each input, the key check, refusals by reason, the fast path."""

from __future__ import annotations

import msgspec
import pytest

from schemas.contract import ControlTargets
from streams.control.config import ControlConfig
from streams.control.controller import ScopeController
from streams.control.dispatch import (
    INPUTS,
    KEY_MISMATCH,
    RULES,
    UNKNOWN_TOPIC,
    Rejected,
    dispatch,
    dispatch_all,
    rule_for,
)
from tests.unit.control.factories import (
    POWERFUL_POOL,
    RANK_BASE_POOL,
    RANK_POOL,
    REGION,
    grant,
    notice,
    outcome,
    report,
    sketch,
)

CONFIG = ControlConfig(period_s=10.0, min_samples=1)


class Controllers(dict[str, ScopeController]):
    """What a caller of the rulebook owns: controllers by scope, created on first use."""

    def __init__(self, config: ControlConfig = CONFIG) -> None:
        super().__init__()
        self.config = config

    def __call__(self, scope: str) -> ScopeController:
        if scope not in self:
            self[scope] = ScopeController(scope, self.config)
        return self[scope]


def test_every_input_topic_has_a_rule_and_targets_are_passed_by() -> None:
    assert INPUTS == ("telemetry", "capacity", "preemption", "outcomes", "overrides", "labels")
    assert rule_for("targets") is None
    with pytest.raises(Rejected) as info:
        rule_for("deadletter")
    assert info.value.reason == UNKNOWN_TOPIC and "deadletter" in info.value.detail
    assert [name for name, rule in RULES.items() if rule.publishes] == ["preemption", "overrides"]
    assert [name for name, rule in RULES.items() if rule.durable] == ["capacity", "preemption",
                                                                 "overrides"]


@pytest.mark.parametrize(("topic", "value"), [
    ("telemetry", report(RANK_POOL)), ("capacity", grant(RANK_POOL)),
    ("preemption", notice(RANK_POOL)), ("outcomes", outcome("s", "baseline", 1.0)),
])
def test_the_scope_of_each_input_is_read_from_its_value(topic: str, value: object) -> None:
    assert RULES[topic].scope(value) == REGION


@pytest.mark.parametrize(("topic", "value"), [
    ("telemetry", report(RANK_POOL)), ("capacity", grant(RANK_POOL)),
    ("preemption", notice(RANK_POOL)), ("outcomes", outcome("s", "baseline", 1.0)),
])
def test_a_key_that_lies_about_the_scope_is_refused_before_any_controller(
        topic: str, value: object) -> None:
    controllers = Controllers()
    for key in ("us1", None, ""):
        with pytest.raises(Rejected) as info:
            dispatch(RULES[topic], key, value, controllers, 0)
        assert info.value.reason == KEY_MISMATCH
        assert "does not match scope 'eu1'" in str(info.value)
    assert controllers == {}


def test_each_input_reaches_its_controller_method() -> None:
    controllers = Controllers()
    assert dispatch(RULES["capacity"], REGION, grant(RANK_POOL, accel=8.0, cpu=64.0),
                    controllers, 0) is None
    assert dispatch(RULES["telemetry"], REGION, report(RANK_POOL), controllers, 0) is None
    assert dispatch(RULES["outcomes"], REGION, outcome("s", "baseline", 1.0), controllers,
                    0) is None
    controller = controllers[REGION]
    assert controller.capacity.cpu_units == 64.0
    assert controller.tick(1000).epoch == 1
    assert [w.pool_id for w in controller.last_windows] == [RANK_POOL]


def test_preemption_yields_targets_to_publish_now() -> None:
    controllers = Controllers()
    dispatch(RULES["capacity"], REGION, grant(POWERFUL_POOL), controllers, 0)
    targets = dispatch(RULES["preemption"], REGION, notice(POWERFUL_POOL, ts_ms=5), controllers,
                       5)
    assert isinstance(targets, ControlTargets)
    assert (targets.scope, targets.reason, targets.epoch) == (REGION, "preemption", 1)
    # a re-announcement of the same reclaim has nothing new to publish
    assert dispatch_all(RULES["preemption"], REGION, [notice(POWERFUL_POOL, ts_ms=6)],
                        controllers, 6) == []


def test_a_report_the_windows_refuse_is_rejected_by_class_name() -> None:
    controllers = Controllers(ControlConfig(max_pools=1))
    dispatch(RULES["telemetry"], REGION, report(RANK_POOL), controllers, 0)
    with pytest.raises(Rejected) as info:
        dispatch(RULES["telemetry"], REGION, report(RANK_BASE_POOL), controllers, 0)
    assert info.value.reason == "TooManyPools" and "max_pools" in info.value.detail
    unlike = msgspec.structs.replace(report(RANK_POOL), latency_ms=msgspec.structs.replace(
        sketch(10.0, 100), relative_accuracy=0.05))
    with pytest.raises(Rejected) as info:
        dispatch(RULES["telemetry"], REGION, unlike, controllers, 0)
    assert info.value.reason == "SketchMismatch"


def test_an_event_routed_to_another_scopes_controller_is_rejected() -> None:
    """The key check passed but the caller handed the wrong controller (a routing bug)."""
    other = ScopeController("us1", CONFIG)
    for topic, value in (("telemetry", report(RANK_POOL)), ("capacity", grant(RANK_POOL)),
                         ("preemption", notice(RANK_POOL)),
                         ("outcomes", outcome("s", "baseline", 1.0))):
        with pytest.raises(Rejected) as info:
            dispatch(RULES[topic], REGION, value, lambda scope: other, 0)
        assert info.value.reason == "ScopeMismatch"


def test_a_batch_with_one_lying_value_is_refused_whole() -> None:
    controllers = Controllers()
    batch = [report(RANK_POOL), report("us1/rank/baseline/a100/opportunistic")]
    with pytest.raises(Rejected) as info:
        dispatch_all(RULES["telemetry"], REGION, batch, controllers, 0)
    assert info.value.reason == KEY_MISMATCH
    assert controllers == {}
    assert dispatch_all(RULES["telemetry"], REGION, batch[:1] * 3, controllers, 0) == []
    assert dispatch_all(RULES["telemetry"], REGION, [], controllers, 0) == []
    assert controllers[REGION].tick(1000).epoch == 1
    assert controllers[REGION].last_windows[0].reports == 3
