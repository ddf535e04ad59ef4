"""Builders for control-core tests: reports, capacity events, notices, outcomes.

Sketches are cached by content: building a DDSketch costs far more than the code under test.
"""

from __future__ import annotations

from functools import lru_cache

from schemas.contract import (
    REPLICA_GRANT_VERSION,
    CapacityEvent,
    LatencySketch,
    PreemptionNotice,
    RoutingOutcome,
    WindowReport,
)
from schemas.sketch import new_sketch, to_wire

REGION = "eu1"
RANK_POOL = f"{REGION}/rank/baseline/a100/opportunistic"
RANK_BASE_POOL = f"{REGION}/rank/baseline/a100/baseline"
POWERFUL_POOL = f"{REGION}/rank/powerful/a100/opportunistic"


@lru_cache(maxsize=256)
def sketch(latency_ms: float, samples: int, tail_ms: float | None = None) -> LatencySketch:
    """``samples`` latencies at ``latency_ms``; with ``tail_ms``, 2% of them at ``tail_ms``
    (so p50 is the first and p99 the second)."""
    s = new_sketch()
    tail = samples // 50 if tail_ms is not None else 0
    if samples - tail:
        s.add(latency_ms, samples - tail)
    if tail and tail_ms is not None:
        s.add(tail_ms, tail)
    return to_wire(s)


def report(pool_id: str = RANK_POOL, *, worker: str = "w1", p99_ms: float = 20.0,
           samples: int = 100, start_ms: int = 0, end_ms: int = 1000,
           requests: int | None = None, capacity_rps: float = 0.0, utilisation: float = 0.5,
           shed: dict[str, int] | None = None, done: int = 0,
           units_done: int = 0) -> WindowReport:
    region, service, model, accelerator, tier = pool_id.split("/")
    return WindowReport(
        pool_id=pool_id, worker_id=worker, region=region, service=service,
        model=model,  # type: ignore[arg-type]
        tier=tier,  # type: ignore[arg-type]
        accelerator=accelerator, window_start_ms=start_ms, window_end_ms=end_ms,
        requests=samples if requests is None else requests,
        baseline_requests=samples if requests is None else requests,
        optional_units_done=done, optional_units_shed=shed or {},
        latency_ms=sketch(p99_ms, samples), utilisation=utilisation, capacity_rps=capacity_rps,
        units_done=units_done)


def grant(pool_id: str = RANK_POOL, *, accel: float = 4.0, cpu: float = 16.0, ts_ms: int = 0,
          expires_at_ms: int | None = None, accelerator: str | None = None,
          kind: str = "grant", replica: str | None = None) -> CapacityEvent:
    """A pool-wide grant or revoke; with ``replica``, that replica's own (v7)."""
    region, _, _, acc, _ = pool_id.split("/")
    mine = {} if replica is None else {"v": REPLICA_GRANT_VERSION, "replica": replica}
    return CapacityEvent(event_id=f"c-{pool_id}-{ts_ms}", ts_ms=ts_ms, region=region,
                         pool_id=pool_id, kind=kind,  # type: ignore[arg-type]
                         accelerator=accelerator or acc, accelerator_units=accel, cpu_units=cpu,
                         expires_at_ms=expires_at_ms, **mine)  # type: ignore[arg-type]


def notice(pool_id: str = RANK_POOL, *, ts_ms: int = 0, replicas: tuple[str, ...] = (),
           accel: float = 0.0, cpu: float = 0.0) -> PreemptionNotice:
    region = pool_id.split("/")[0]
    return PreemptionNotice(notice_id=f"p-{pool_id}-{ts_ms}", ts_ms=ts_ms, region=region,
                            pool_id=pool_id, replicas=list(replicas), deadline_ms=ts_ms + 30_000,
                            accelerator_units=accel, cpu_units=cpu)


def outcome(segment: str, model: str, value: float, *, ts_ms: int = 0,
            request_id: str = "r") -> RoutingOutcome:
    return RoutingOutcome(ts_ms=ts_ms, scope=REGION, request_id=request_id, segment=segment,
                          model=model,  # type: ignore[arg-type]
                          value=value)
