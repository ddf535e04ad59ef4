from __future__ import annotations

import msgspec
import pytest

from schemas.sketch import SketchMismatch
from streams.control.windows import (
    LatencyWindow,
    TooManyPools,
    WindowSet,
    WindowStats,
    extras_room,
    overload_per_request,
)
from tests.unit.control.factories import POWERFUL_POOL, RANK_POOL, report, sketch


def test_merges_quantiles_and_sums_rates_over_report_span() -> None:
    windows = WindowSet(min_samples=50, opened_ms=0)
    for second in range(10):
        for worker, ms in (("w1", 10.0), ("w2", 40.0)):
            windows.add(report(worker=worker, p99_ms=ms, samples=100, requests=100,
                               start_ms=second * 1000, end_ms=(second + 1) * 1000,
                               capacity_rps=150.0, utilisation=0.4 if worker == "w1" else 0.8,
                               shed={"overload": 3, "preemption": 2}, done=50))
    [stats] = windows.close(10_000)
    assert stats.pool_id == RANK_POOL and stats.model == "baseline"
    assert (stats.start_ms, stats.end_ms) == (0, 10_000)
    assert stats.samples == 2000 and stats.reports == 20
    assert stats.p50_ms == pytest.approx(10.0, rel=0.03)
    assert stats.p99_ms == pytest.approx(40.0, rel=0.03)
    assert stats.request_rate == pytest.approx(200.0)
    assert stats.optional_done_rate == pytest.approx(100.0)
    assert stats.shed_rate == pytest.approx(10.0)
    assert stats.overload_shed_rate == pytest.approx(6.0)
    assert overload_per_request([stats], "baseline") == pytest.approx(6.0 / 200.0)
    assert overload_per_request([stats], "powerful") is None
    assert stats.utilisation == pytest.approx(0.6)
    assert stats.capacity_rps == pytest.approx(300.0)   # per worker latest, summed
    assert stats.enough_samples


def test_tail_shows_in_p99_not_p50() -> None:
    window = LatencyWindow(RANK_POOL, "eu1", "baseline", "opportunistic", "a100", 10)
    r = report(samples=1000)
    window.add(msgspec.structs.replace(r, latency_ms=sketch(10.0, 1000, tail_ms=300.0)))
    stats = window.close(1000)
    assert (stats.start_ms, stats.end_ms) == (0, 1000)     # opened at the first report
    assert stats.p50_ms == pytest.approx(10.0, rel=0.03)
    assert stats.p99_ms == pytest.approx(300.0, rel=0.03)


def test_few_samples_are_flagged() -> None:
    windows = WindowSet(min_samples=50, opened_ms=0)
    windows.add(report(samples=49))
    [stats] = windows.close(10_000)
    assert stats.samples == 49
    assert not stats.enough_samples


def test_close_starts_a_fresh_period() -> None:
    windows = WindowSet(min_samples=1, opened_ms=0)
    windows.add(report(samples=100))
    windows.close(10_000)
    [stats] = windows.close(20_000)
    assert (stats.start_ms, stats.end_ms) == (10_000, 20_000)
    assert stats.samples == 0 and stats.reports == 0
    assert stats.p99_ms == 0.0 and stats.capacity_rps == 0.0
    assert not stats.enough_samples
    msgspec.json.decode(msgspec.json.encode(stats), type=WindowStats)   # JSON-safe (no NaN)


def test_routes_by_pool_and_closes_in_pool_order() -> None:
    windows = WindowSet(min_samples=1)
    windows.add(report(POWERFUL_POOL, p99_ms=100.0))
    windows.add(report(RANK_POOL, p99_ms=20.0))
    stats = windows.close(1000)
    assert [s.pool_id for s in stats] == sorted([POWERFUL_POOL, RANK_POOL])
    by_pool = {s.pool_id: s for s in stats}
    assert by_pool[POWERFUL_POOL].p99_ms == pytest.approx(100.0, rel=0.03)
    assert by_pool[RANK_POOL].p99_ms == pytest.approx(20.0, rel=0.03)


def test_silent_pools_are_forgotten() -> None:
    windows = WindowSet(min_samples=1, forget_after_periods=2)
    windows.add(report())
    windows.close(1000)
    windows.close(2000)
    assert RANK_POOL in windows
    windows.close(3000)
    assert RANK_POOL not in windows


def test_pool_count_is_bounded() -> None:
    windows = WindowSet(min_samples=1, max_pools=1)
    windows.add(report(RANK_POOL))
    with pytest.raises(TooManyPools, match="max_pools"):
        windows.add(report(POWERFUL_POOL))


def test_unlike_sketch_is_refused_before_anything_changes() -> None:
    window = LatencyWindow(RANK_POOL, "eu1", "baseline", "opportunistic", "a100", 1)
    bad = msgspec.structs.replace(report(), latency_ms=msgspec.structs.replace(
        sketch(10.0, 100), relative_accuracy=0.05))
    with pytest.raises(SketchMismatch):
        window.add(bad)
    assert window.close(1000).reports == 0


def test_counts_without_bins_do_not_count_as_samples() -> None:
    window = LatencyWindow(RANK_POOL, "eu1", "baseline", "opportunistic", "a100", 1,
                           opened_ms=0)
    hollow = msgspec.structs.replace(sketch(10.0, 100), bins=[], zero_count=0)
    window.add(msgspec.structs.replace(report(), latency_ms=hollow))
    stats = window.close(1000)
    assert stats.samples == 0 and not stats.enough_samples and stats.p99_ms == 0.0


def test_a_pools_precompute_share_is_its_reports_mean_and_zero_where_none_runs_it() -> None:
    windows = WindowSet(min_samples=1, opened_ms=0)
    for worker, busy in (("w1", 0.3), ("w2", 0.6), ("w3", None)):
        extra = {} if busy is None else {"v": 13, "precompute_utilisation": busy}
        windows.add(msgspec.structs.replace(report(RANK_POOL, worker=worker), **extra))
    windows.add(report(POWERFUL_POOL, worker="p1"))
    ranking, powerful = windows.close(1_000)
    assert ranking.precompute_utilisation == pytest.approx(0.3)
    assert powerful.precompute_utilisation == 0.0


def test_a_pools_room_is_the_largest_its_replicas_reported_and_unknown_without_one() -> None:
    windows = WindowSet(min_samples=1, opened_ms=0)
    for worker, room in (("w1", 40), ("w2", 64), ("w3", None)):
        extra = {} if room is None else {"v": 10, "extras_room": room}
        windows.add(msgspec.structs.replace(report(RANK_POOL, worker=worker), **extra))
    windows.add(report(POWERFUL_POOL, worker="p1"))
    stats = windows.close(1_000)
    assert [w.extras_room for w in stats] == [64, None]   # pool order: ranking, powerful
    assert extras_room(stats, "baseline") == 64
    assert extras_room(stats, "powerful") is None
    assert windows.close(2_000)[0].extras_room is None    # a new period measures afresh
