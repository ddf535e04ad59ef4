"""Small event logs for replay tests, built from the control-core test factories."""

from __future__ import annotations

from pathlib import Path

from schemas.contract import ControlTargets, RmaTarget, SbmTarget
from streams.eventlog import AnyEvent, make_event, write_events
from tests.unit.control.factories import (
    POWERFUL_POOL,
    RANK_BASE_POOL,
    RANK_POOL,
    REGION,
    grant,
    notice,
    outcome,
    report,
)

T0 = 1_700_000_000_000


def small_log_events(seconds: int = 60) -> list[AnyEvent]:
    """A minute of one region: grants, per-second reports of three pools, outcomes, one
    preemption and one recorded target, in time order."""
    events: list[AnyEvent] = []
    for pool in (RANK_POOL, POWERFUL_POOL):
        events.append(make_event(T0, "capacity", REGION,
                                 grant(pool, ts_ms=T0, accel=4.0, cpu=16.0)))
    for s in range(1, seconds + 1):
        now = T0 + s * 1000
        for pool, p99 in ((RANK_BASE_POOL, 40.0), (RANK_POOL, 45.0), (POWERFUL_POOL, 120.0)):
            events.append(make_event(now, "telemetry", REGION, report(
                pool, p99_ms=p99 + (s % 7), samples=120, start_ms=now - 1000, end_ms=now,
                capacity_rps=60.0 if "powerful" in pool else 0.0, done=100)))
        model = "powerful" if s % 3 == 0 else "baseline"
        events.append(make_event(now, "outcomes", REGION, outcome(
            f"seg{s % 4}", model, 1.0 + 0.1 * (s % 4), ts_ms=now, request_id=f"r{s}")))
        if s == seconds // 2:
            events.append(make_event(now, "preemption", REGION, notice(POWERFUL_POOL,
                                                                       ts_ms=now)))
        if s == 5:
            events.append(make_event(now, "targets", REGION, ControlTargets(
                scope=REGION, epoch=99, issued_at_ms=now, ttl_ms=30_000,
                rma=RmaTarget(extra_candidates=7, budget_units_per_s=10.0),
                sbm=SbmTarget(coverage=0.1))))
    return events


def write_small_log(path: Path, seconds: int = 60) -> list[AnyEvent]:
    events = small_log_events(seconds)
    write_events(path, events)
    return events
