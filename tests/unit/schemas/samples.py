"""One valid instance of every event type, shared by contract tests."""

from __future__ import annotations

from schemas.contract import (
    CapacityEvent,
    ControlTargets,
    DeadLetter,
    Event,
    LatencySketch,
    LiftEstimate,
    LiftReport,
    OperatorOverride,
    OutcomeLabel,
    PoolPartial,
    PreemptionNotice,
    ReplicaAnnouncement,
    RmaTarget,
    RoutingOutcome,
    SbmTarget,
    SegmentPriority,
    WindowPartial,
    WindowReport,
)
from schemas.precompute import PrecomputeJob, PrecomputeResult
from schemas.sketch import new_sketch, to_wire


def _sketch():
    sketch = new_sketch()
    for ms in (1.5, 2.0, 3.0, 40.0, 90.0):
        sketch.add(ms)
    return to_wire(sketch)


SAMPLES: list[Event] = [
    WindowReport(pool_id="eu1/rank/a100/opp", worker_id="w1", region="eu1", service="rank",
                 model="baseline", tier="opportunistic", accelerator="a100",
                 window_start_ms=1_700_000_000_000, window_end_ms=1_700_000_001_000,
                 requests=120, baseline_requests=100, optional_units_done=400,
                 optional_units_shed={"preemption": 12}, latency_ms=_sketch(), queue_depth=3,
                 queue_delay_ms=1.2, utilisation=0.7, capacity_rps=180.0),
    CapacityEvent(event_id="c1", ts_ms=1_700_000_000_000, region="eu1", pool_id="eu1/a100/opp",
                  kind="grant", accelerator="a100", accelerator_units=4.0, cpu_units=16.0,
                  expires_at_ms=1_700_000_600_000),
    CapacityEvent(v=7, event_id="c2", ts_ms=1_700_000_000_000, region="eu1",
                  pool_id="eu1/a100/opp", kind="grant", accelerator="a100",
                  accelerator_units=1.0, cpu_units=4.0, expires_at_ms=1_700_000_015_000,
                  replica="w3"),
    PreemptionNotice(notice_id="p1", ts_ms=1_700_000_000_000, region="eu1",
                     pool_id="eu1/a100/opp", replicas=["w3", "w4"],
                     deadline_ms=1_700_000_030_000, accelerator="a100", accelerator_units=2.0),
    ControlTargets(scope="eu1/rank", epoch=42, issued_at_ms=1_700_000_000_000, ttl_ms=30_000,
                   rma=RmaTarget(extra_candidates=64, budget_units_per_s=5000.0),
                   sbm=SbmTarget(coverage=0.25, segments={
                       "new-users": SegmentPriority(gain_mean=0.03, gain_std=0.01,
                                                    observations=500)})),
    RoutingOutcome(ts_ms=1_700_000_000_000, scope="eu1/rank", request_id="r1",
                   segment="new-users", model="powerful", value=0.031, explored=True),
    RoutingOutcome(ts_ms=1_700_000_000_000, scope="eu1", request_id="r2",
                   segment="new-users", model="baseline", extra=32, propensity=0.8,
                   holdout=False),
    OutcomeLabel(ts_ms=1_700_000_060_000, scope="eu1", request_id="r2", value=1.25),
    LiftReport(scope="eu1", ts_ms=1_700_000_060_000, epoch=7,
               lift={"all": LiftEstimate(measured=0.14, ci_low=0.12, ci_high=0.16),
                     "sbm": LiftEstimate()},
               join={"joined": 900, "late": 3, "orphan": 1}, treated=890, holdout=10),
    DeadLetter(ts_ms=1_700_000_000_000, source_topic="surplus.telemetry", partition=3,
               offset=1234, reason="WindowReport: malformed JSON", key_b64="cDE=",
               value_b64="bm90IGpzb24="),
    OperatorOverride(scope="eu1", issued_at_ms=1_700_000_000_000, ttl_ms=3_600_000,
                     reason="incident 4711: ranking p99 over SLA", by="alice", max_extra=8,
                     max_coverage=0.1),
    ReplicaAnnouncement(replica_id="w3", endpoint="http://10.0.0.3:8080", region="eu1",
                        pool_id="eu1/rank/baseline/a100/opportunistic", tier="opportunistic",
                        model="baseline", state="serving", ts_ms=1_700_000_000_000,
                        lease_expires_at_ms=1_700_000_010_000),
    WindowPartial(region="eu1", shard="3", period_end_ms=1_700_000_005_000, pools=[PoolPartial(
        pool_id="eu1/rank/a100/opp", model="baseline", tier="opportunistic",
        accelerator="a100", reports=12, requests=1200, baseline_requests=1180,
        optional_units_done=9000, optional_units_shed=40, overload_shed=30,
        utilisation_sum=7.5, capacity_rps=2400.0, busy_s=6.1, units_done=40_000,
        optional_requests_done=1000, extras_room=64, first_start_ms=1_700_000_000_000,
        last_end_ms=1_700_000_005_000,
        latency_ms=LatencySketch(relative_accuracy=0.02, offset=80, bins=[5, 900, 295],
                                 count=1200, sum=24_000.0, min=18.0, max=40.0))]),
    WindowPartial(region="eu1", shard="4", period_end_ms=1_700_000_005_000),
    PrecomputeJob(job_key="user-42", scope="eu1", segment="s1", model="powerful",
                  issued_at_ms=1_700_000_000_000, expires_at_ms=1_700_000_060_000,
                  body=b"\x82\xa1n\x02", top=50),
    PrecomputeResult(job_key="user-42", scope="eu1", segment="s1", model="powerful",
                     pool_id="eu1/deep/opp", worker_id="p1", issued_at_ms=1_700_000_000_000,
                     computed_at_ms=1_700_000_001_000, expires_at_ms=1_700_000_060_000,
                     candidates=400, top_ids=[17, 3], top_scores=[0.9, 0.7]),
]
