"""The surge rule (``workers.policy.surge``): optional work yields to a baseline burst the
control loop has not seen, down to its floor share of the replica's throughput."""

from __future__ import annotations

from workers.policy.admission_config import AdmissionConfig
from workers.policy.load_meter import LoadMeter
from workers.policy.surge import SurgeRule

CFG = AdmissionConfig(surge_window_ms=100.0, settled_window_ms=10_000.0, surge_min_items=8.0,
                      surge_floor_share=0.0)


def run(rule: SurgeRule, start: int, end: int, units: float) -> None:
    for t in range(start, end):
        rule.load.advance(t)
        rule.load.add(units, optional=False)


def rule_after_steady_load() -> SurgeRule:
    rule = SurgeRule(CFG, LoadMeter(CFG.surge_window_ms, CFG.settled_window_ms))
    rule.load.advance(0)
    run(rule, 1, 20_001, 0.1)  # one unit every 10 ms for 20 s
    return rule


def test_steady_load_is_no_surge() -> None:
    assert not rule_after_steady_load().surging(20_000)


def test_a_burst_of_baseline_is_a_surge() -> None:
    rule = rule_after_steady_load()
    run(rule, 20_001, 20_101, 2.0)
    assert rule.surging(20_100)


def test_a_few_items_are_chance_not_a_burst() -> None:
    rule = SurgeRule(CFG, LoadMeter(CFG.surge_window_ms, CFG.settled_window_ms))
    rule.load.advance(0)
    run(rule, 10_000, 10_003, 50.0)  # three large items: far over the rate, too few
    assert not rule.surging(10_003)


def test_during_a_surge_optional_work_over_the_ceiling_is_refused() -> None:
    rule = rule_after_steady_load()
    run(rule, 20_001, 20_101, 2.0)
    assert rule.refuses(1, 20_100, per_unit_ms=1.0)
    assert not rule_after_steady_load().refuses(1, 20_000, per_unit_ms=1.0)


def test_the_ceiling_is_at_least_the_floor_share_of_the_throughput() -> None:
    floor = AdmissionConfig(surge_floor_share=0.5)
    rule = SurgeRule(floor, LoadMeter(floor.surge_window_ms, floor.settled_window_ms))
    assert rule.ceiling(per_unit_ms=0.25) == 2.0  # half of 4 units per ms
