"""The demo's numbers of record, computed from recorded events: SLA windows judged like the
control plane judges them, targets in force (zero once expired), capacity on the books, and the
preemption-reaction p99 read from histogram buckets the way Prometheus reads them."""

from __future__ import annotations

import math

import numpy as np

from schemas.contract import (
    CapacityEvent,
    ControlTargets,
    PreemptionNotice,
    RmaTarget,
    SbmTarget,
    WindowReport,
)
from schemas.sketch import new_sketch, to_wire
from surplus import localkafka
from surplus.demo import analysis, reactions
from surplus.demo import report as demo_report
from surplus.demo.analysis import RunInfo, Telemetry

T0 = 1_700_000_000_000


def info(**kw: object) -> RunInfo:
    base: dict[str, object] = dict(
        scenario="t", region="eu1", start_ms=T0, end_ms=T0 + 10_000, duration_s=10.0,
        period_ms=2000, min_samples=20, sla_p99_ms=50.0, sbm_sla_p99_ms=80.0,
        base_candidates=16, phases=[], storms=[], replicas=[])
    base.update(kw)
    return RunInfo(**base)  # type: ignore[arg-type]


def report(end_ms: int, latencies: list[float], pool: str = "eu1/rank/baseline/cpu/baseline",
           model: str = "baseline") -> WindowReport:
    sketch = new_sketch()
    for ms in latencies:
        sketch.add(ms)
    return WindowReport(
        pool_id=pool, worker_id="w", region="eu1", service="rank", model=model,  # type: ignore[arg-type]
        tier="baseline", accelerator="cpu", window_start_ms=end_ms - 1000, window_end_ms=end_ms,
        requests=len(latencies), baseline_requests=len(latencies), latency_ms=to_wire(sketch),
        optional_units_done=5, optional_units_shed={"preemption": 2})


def test_every_window_with_a_baseline_request_is_judged_few_samples_included() -> None:
    run = info(deadline_ms=100.0)
    tel = Telemetry()
    analysis._telemetry(tel, report(T0 + 1000, [5.0] * 30), run)            # window 0: fine
    analysis._telemetry(tel, report(T0 + 3000, [5.0] * 25 + [90.0] * 5), run)  # window 1: over
    analysis._telemetry(tel, report(T0 + 5000, [200.0] * 10), run)  # window 2: few, all late
    analysis._telemetry(tel, report(T0 + 7000, [5.0] * 3), run)     # window 3: few, in time
    windows = analysis.sla_windows(tel, run)
    assert [(w.judged, w.violated) for w in windows] == [
        (True, False), (True, True), (True, True), (True, False), (False, False)]
    assert windows[1].p99_ms is not None and windows[1].p99_ms > 50.0
    assert windows[2].over == ("ranking",)


def test_the_worst_pool_decides_a_window() -> None:
    run = info()
    tel = Telemetry()
    analysis._telemetry(tel, report(T0 + 1000, [5.0] * 30), run)
    analysis._telemetry(tel, report(T0 + 1500, [70.0] * 30, pool="eu1/rank/baseline/cpu/opp"), run)
    assert analysis.sla_windows(tel, run)[0].violated


def test_a_small_slow_pool_counts_in_the_merged_ranking_path() -> None:
    """A pool under min_samples is not the control plane's measure, but its requests are
    baseline requests: 3 slow of 30 put the ranking path's p99 over the SLA."""
    run = info()
    tel = Telemetry()
    analysis._telemetry(tel, report(T0 + 1000, [5.0] * 27), run)
    analysis._telemetry(tel, report(T0 + 1500, [90.0] * 3, pool="eu1/rank/baseline/cpu/opp"), run)
    w = analysis.sla_windows(tel, run)[0]
    assert w.judged and w.violated and w.samples == 30


def test_requests_the_powerful_model_served_are_judged_against_the_deadline() -> None:
    run = info(deadline_ms=100.0)
    tel = Telemetry()
    pool = "eu1/rank/powerful/cpu/opportunistic"
    analysis._telemetry(tel, report(T0 + 1000, [90.0] * 30, pool=pool, model="powerful"), run)
    analysis._telemetry(tel, report(T0 + 3000, [150.0] * 2, pool=pool, model="powerful"), run)
    w0, w1 = analysis.sla_windows(tel, run)[:2]
    assert (w0.judged, w0.violated, w0.p99_ms, w0.powerful_samples) == (True, False, None, 30)
    assert (w1.judged, w1.violated, w1.over) == (True, True, ("powerful",))


def test_without_a_recorded_deadline_the_powerful_path_is_not_judged() -> None:
    run = info()  # a run.json from before the deadline was recorded
    tel = Telemetry()
    analysis._telemetry(tel, report(T0 + 1000, [500.0] * 5, pool="p", model="powerful"), run)
    assert not analysis.sla_windows(tel, run)[0].judged


def test_judge_names_each_path_over_its_own_bound() -> None:
    w = analysis.judge(3, 6.0, (55.0, 10), (120.0, 4), sla_ms=50.0, deadline_ms=100.0)
    assert (w.judged, w.violated, w.over) == (True, True, ("ranking", "powerful"))
    w = analysis.judge(3, 6.0, (None, 0), (None, 0), sla_ms=50.0, deadline_ms=100.0)
    assert (w.judged, w.violated) == (False, False)


def test_client_windows_judge_fallbacks_whole_against_the_deadline() -> None:
    run = info(deadline_ms=100.0)
    t = np.array([0.1, 0.2, 0.3, 2.1, 2.2, 4.5])
    req = analysis.Requests(
        t_s=t, latency_ms=np.array([10.0, 70.0, 20.0, 95.0, 30.0, math.nan]),
        ok=np.array([True, True, True, True, True, False]),
        model=["baseline", "powerful", "baseline", "baseline", "baseline", "baseline"],
        errors={}, fell_back=np.array([False, False, False, True, False, False]))
    windows = analysis.client_sla_windows(req, run)
    assert [(w.judged, w.violated) for w in windows] == [
        (True, False), (True, False), (True, True), (False, False), (False, False)]
    assert windows[0].powerful_samples == 1 and windows[1].powerful_p99_ms == 95.0
    assert windows[2].over == ("ranking",)  # a failed request is never in time


def test_reports_outside_the_load_phase_are_not_judged_but_their_work_counts() -> None:
    run = info()
    tel = Telemetry()
    analysis._telemetry(tel, report(T0 - 500, [500.0] * 50), run)  # warm-up, before the start
    assert not any(w.judged for w in analysis.sla_windows(tel, run))
    assert tel.done["rma"] == 5 and tel.shed["preemption"] == 2


def test_targets_count_as_zero_once_their_ttl_has_passed() -> None:
    run = info()
    t = ControlTargets(scope="eu1", epoch=1, issued_at_ms=T0 + 1000, ttl_ms=3000,
                       rma=RmaTarget(extra_candidates=40, budget_units_per_s=1.0),
                       sbm=SbmTarget(coverage=0.5))
    series = analysis.targets_series([t], run)
    assert series["extra_candidates"] == ([1.0, 4.0], [40, 0.0])
    assert math.isclose(analysis.time_weighted_mean(series["extra_candidates"], 0.0, 10.0), 12.0)
    assert math.isclose(analysis.time_weighted_mean(series["coverage"], 0.0, 10.0), 0.15)


def test_capacity_on_the_books_drops_at_the_notice_not_the_deadline() -> None:
    run = info()
    grant = CapacityEvent(event_id="g", ts_ms=T0 + 1000, region="eu1", pool_id="p", kind="grant",
                          accelerator="cpu", accelerator_units=2.0, cpu_units=8.0,
                          expires_at_ms=T0 + 60_000)
    notice = PreemptionNotice(notice_id="n", ts_ms=T0 + 5000, region="eu1", pool_id="p",
                              deadline_ms=T0 + 6000)
    _, ys = analysis.lent_series([(grant.ts_ms, "capacity", grant),
                                   (notice.ts_ms, "preemption", notice)], run, step_ms=1000)
    assert ys == [0.0, 2.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(0.001, 0.0), (0.002, 50.0), (0.005, 100.0), (math.inf, 100.0)]
    assert math.isclose(reactions.histogram_quantile(0.5, buckets) or 0, 0.002)
    assert math.isclose(reactions.histogram_quantile(0.99, buckets) or 0, 0.002 + 0.003 * 0.98)
    assert reactions.histogram_quantile(0.99, []) is None
    over = [(0.001, 0.0), (math.inf, 4.0)]
    assert reactions.histogram_quantile(0.99, over) == 0.001  # past the last bound: that bound


def test_reaction_buckets_sum_over_workers() -> None:
    text = ('surplus_worker_preemption_reaction_seconds_bucket{le="0.005"} 1.0\n'
            'surplus_worker_preemption_reaction_seconds_bucket{le="+Inf"} 2.0\n'
            'surplus_worker_preemptions_total 2.0\n')
    buckets = reactions.reaction_buckets({"a": text, "b": text})
    assert buckets == [(0.005, 2.0), (math.inf, 4.0)]
    text += ("surplus_worker_preemption_reaction_seconds_sum 0.006\n"
             "surplus_worker_preemption_reaction_seconds_count 2.0\n")
    assert math.isclose(reactions.reaction_mean_s({"a": text, "b": text}) or 0, 0.003)
    delivery = 'surplus_worker_preemption_delivery_seconds_bucket{le="0.001"} 1.0\n'
    assert reactions.reaction_buckets({"a": text + delivery}, reactions.DELIVERY) == [(0.001, 1.0)]


def test_precompute_stop_is_reported_beside_the_extras_shed_only_where_it_ran() -> None:
    stop = ('surplus_worker_precompute_stop_seconds_bucket{le="0.004"} 0.0\n'
            'surplus_worker_precompute_stop_seconds_bucket{le="0.006"} 100.0\n'
            'surplus_worker_precompute_stop_seconds_bucket{le="+Inf"} 100.0\n')
    out = demo_report._precompute_stop({"w": stop}, 0.005)
    assert out["precompute_stop_reactions"] == 100
    assert out["precompute_stop_p99_ms"] == 5.98
    assert out["precompute_stop_vs_shed_p99"] == 1.196
    assert demo_report._precompute_stop({"w": "surplus_worker_preemptions_total 1.0\n"},
                                        0.005) == {}


def test_notice_paths_say_which_copy_came_first_summed_over_workers() -> None:
    text = ('surplus_worker_preemption_notices_total{outcome="applied",path="http"} 9.0\n'
            'surplus_worker_preemption_notices_total{outcome="duplicate",path="kafka"} 9.0\n'
            'surplus_worker_preemption_notices_created{outcome="applied",path="http"} 1.7e9\n')
    other = 'surplus_worker_preemption_notices_total{outcome="applied",path="kafka"} 1.0\n'
    assert reactions.notice_paths({"a": text, "b": text + other}) == {
        "http": {"applied": 18}, "kafka": {"applied": 1, "duplicate": 18}}
    assert reactions.notice_paths({"a": "surplus_worker_preemptions_total 1.0\n"}) == {}


def test_client_windows_take_only_requests_the_ranking_pool_served() -> None:
    run = info(min_samples=3)
    t = np.array([0.1, 0.2, 0.3, 0.4, 2.1])
    req = analysis.Requests(t_s=t, latency_ms=np.array([1.0, 2.0, 3.0, 100.0, 5.0]),
                            ok=np.array([True, True, True, True, True]),
                            model=["baseline", "baseline", "baseline", "powerful", "baseline"],
                            errors={})
    xs, ys = analysis.client_windows(req, run)
    assert xs == [0.0] and ys[0] < 3.0


def test_busy_share_counts_only_seconds_with_capacity_lent() -> None:
    run = info()
    grant = CapacityEvent(event_id="g", ts_ms=T0 + 2000, region="eu1", pool_id="p", kind="grant",
                          accelerator="cpu", accelerator_units=2.0, expires_at_ms=T0 + 60_000)
    tel = Telemetry()
    for second in range(1, 10):
        r = report(T0 + second * 1000, [5.0])
        tel_report = msgspec_replace(r, tier="opportunistic", utilisation=0.5,
                                     busy_s=0.5, units_done=100)
        analysis._telemetry(tel, tel_report, run)
    share = analysis.busy_share_lent(tel, [(grant.ts_ms, "capacity", grant)], run)
    assert share is not None and 0.2 < share <= 0.5  # one replica at 0.5 of 2 units lent
    assert analysis.busy_share_lent(tel, [], run) is None


def test_limited_by_counts_period_targets_per_lever() -> None:
    def targets(reason: str, rma: str, sbm: str) -> ControlTargets:
        return ControlTargets(
            scope="eu1", epoch=1, issued_at_ms=T0, ttl_ms=1000, reason=reason,  # type: ignore[arg-type]
            rma=RmaTarget(extra_candidates=1, budget_units_per_s=1.0, limited_by=rma),  # type: ignore[arg-type]
            sbm=SbmTarget(coverage=0.1, limited_by=sbm))  # type: ignore[arg-type]

    got = analysis.limited_by([targets("period", "sla", "max"), targets("period", "sla", "hold"),
                               targets("preemption", "preemption", "preemption")])
    assert got == {"rma": {"sla": 2}, "sbm": {"hold": 1, "max": 1}}


def msgspec_replace(report: WindowReport, **changes: object) -> WindowReport:
    import msgspec

    return msgspec.structs.replace(report, **changes)


def test_broker_pauses_are_read_from_its_collector_log_within_the_load() -> None:
    log = "\n".join([
        "[1700000000004ms] Using Serial",
        f"[{T0 - 500}ms] GC(0) Pause Full (Metadata GC Threshold) 66M->8M(247M) 39.626ms",
        f"[{T0 + 2_000}ms] GC(1) Pause Young (Allocation Failure) 76M->20M(247M) 12.5ms",
        f"[{T0 + 7_000}ms] GC(2) Pause Young (Allocation Failure) 89M->39M(247M) 30ms",
        f"[{T0 + 11_000}ms] GC(3) Pause Young (Allocation Failure) 89M->39M(247M) 50.0ms"])
    pauses = localkafka.gc_pauses(log)
    assert pauses[1] == (T0 + 2_000, 12.5) and len(pauses) == 4
    summary = demo_report.broker_pauses(info(), pauses)   # the load ran T0 .. T0 + 10 s
    assert summary == {"broker_gc_pauses": 2, "broker_gc_pause_max_ms": 30.0,
                       "broker_gc_paused_share": 0.00425}
