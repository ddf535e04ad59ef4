"""The controllers the simulator compares: what each one decides, from the same events."""

from __future__ import annotations

import pytest

from sim.controllers import NaivePlane, SurplusPlane, greedy_plane, make_plane, static_plane
from sim.scenario import NaiveConfig, StaticConfig
from streams.control.config import ControlConfig
from streams.eventlog import make_event
from tests.unit.control.factories import RANK_BASE_POOL, REGION, report

START = 1_700_006_400_000
CONFIG = ControlConfig(period_s=10.0, min_samples=10)


def _feed_reports(plane, p99_ms: float, utilisation: float, seconds: int = 10) -> list:
    out = []
    for s in range(1, seconds + 1):
        now = START + s * 1000
        out += plane.feed(make_event(now, "telemetry", REGION, report(
            RANK_BASE_POOL, p99_ms=p99_ms, samples=100, start_ms=now - 1000, end_ms=now,
            utilisation=utilisation, capacity_rps=100.0)))
    return out + plane.advance(START + seconds * 1000)


def test_greedy_always_asks_for_the_most_optional_work() -> None:
    targets = _feed_reports(greedy_plane(CONFIG, [REGION]), p99_ms=500.0, utilisation=1.0)
    assert len(targets) == 1
    assert targets[0].rma.extra_candidates == CONFIG.rma.max_extra_candidates
    assert targets[0].sbm.coverage == CONFIG.sbm.max_coverage


def test_static_reissues_its_fixed_targets_every_period() -> None:
    plane = static_plane(CONFIG, [REGION], StaticConfig(extra_candidates=5, coverage=0.1))
    first = _feed_reports(plane, 20.0, 0.1)
    second = _feed_reports(plane, 20.0, 0.1, seconds=20)
    assert [t.epoch for t in first + second] == [1, 2]
    assert {(t.rma.extra_candidates, t.sbm.coverage) for t in first + second} == {(5, 0.1)}


@pytest.mark.parametrize(("p99", "util", "expected"), [
    (50.0, 0.5, 8.8),      # fast and spare capacity: x1.1
    (50.0, 0.8, 8.0),      # fast but less than 30% spare: hold
    (92.0, 0.5, 8.0),      # between 0.9 and 0.95 of the SLA: hold
    (99.0, 0.5, 7.2),      # above 0.95 x SLA: x0.9
])
def test_naive_multiplies_by_the_textbook_rule(p99: float, util: float, expected: float) -> None:
    plane = NaivePlane(CONFIG, [REGION], NaiveConfig(initial_extra=8))
    targets = _feed_reports(plane, p99, util)
    assert plane.extra[REGION] == pytest.approx(expected)
    assert targets[0].rma.extra_candidates == int(expected)
    assert targets[0].sbm.coverage == NaiveConfig().coverage_target


def test_naive_has_no_preemption_fast_path_but_surplus_does() -> None:
    from tests.unit.control.factories import RANK_POOL, grant, notice

    for plane, fast in ((NaivePlane(CONFIG, [REGION], NaiveConfig()), False),
                        (SurplusPlane(CONFIG), True)):
        plane.feed(make_event(START, "capacity", REGION, grant(RANK_POOL, ts_ms=START)))
        out = plane.feed(make_event(START + 500, "preemption", REGION,
                                    notice(RANK_POOL, ts_ms=START + 500)))
        assert bool(out) is fast
        if fast:
            assert out[0].reason == "preemption"


def test_pid_is_an_alias_and_unknown_names_list_the_known_ones() -> None:
    assert make_plane("pid", CONFIG, [REGION], static=StaticConfig(),
                      naive=NaiveConfig()).name == "surplus"
    with pytest.raises(ValueError, match="surplus, static, greedy, naive, off"):
        make_plane("clever", CONFIG, [REGION], static=StaticConfig(), naive=NaiveConfig())


def test_the_surplus_plane_runs_each_region_with_its_scope_overrides() -> None:
    config = ControlConfig(period_s=10.0, min_samples=10, scopes={REGION: {"ttl_s": 7.0}})
    targets = _feed_reports(SurplusPlane(config), p99_ms=20.0, utilisation=0.1)
    assert targets and {t.ttl_ms for t in targets} == {7_000}
