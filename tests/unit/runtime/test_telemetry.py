"""Telemetry windows: per-interval counts and growth of cumulative totals, capacity estimate."""

from __future__ import annotations

import pytest

from schemas.sketch import SketchMerger
from workers.runtime.telemetry import Identity, LoadTotals, TelemetryWindow

IDENT = Identity(pool_id="eu1/rank/baseline/cpu/baseline", worker_id="w1", region="eu1",
                 service="rank", model="baseline", tier="baseline", accelerator="cpu")


def totals(rows: int = 0, busy_s: float = 0.0, shed: dict[str, int] | None = None,
           ms_per_unit: float = 0.05) -> LoadTotals:
    return LoadTotals(rows_done=rows, busy_s=busy_s, shed_units=shed or {}, queue_items=2,
                      queue_delay_ms=1.5, ms_per_unit=ms_per_unit)


def test_a_window_reports_its_requests_latencies_and_growth_of_totals() -> None:
    window = TelemetryWindow(IDENT, start_ms=1_000)
    window.close(1_000, totals(rows=100, busy_s=0.1, shed={"overload": 4}))  # baseline totals
    for latency in (2.0, 4.0, 8.0):
        window.record(latency, baseline=True, rows=10, optional_units_done=2)
    window.record(1.0, baseline=False, rows=10, optional_units_done=10)
    window.record_rejected(baseline=True)
    report = window.close(2_000, totals(rows=140, busy_s=0.3,
                                        shed={"overload": 10, "deadline": 1}))
    assert (report.window_start_ms, report.window_end_ms) == (1_000, 2_000)
    assert (report.requests, report.baseline_requests, report.baseline_rejected) == (5, 3, 1)
    assert report.optional_units_done == 16
    assert report.optional_units_shed == {"overload": 6, "deadline": 1}
    assert report.utilisation == pytest.approx(0.2)
    # 40 rows in 0.2 busy seconds = 200 rows/s; 40 rows over 4 requests = 10 rows each.
    assert report.capacity_rps == pytest.approx(20.0)
    merger = SketchMerger(report.latency_ms.relative_accuracy)
    merger.add(report.latency_ms)
    assert merger.count == 4 and merger.quantile(1.0) == pytest.approx(8.0, rel=0.03)
    assert (report.queue_depth, report.queue_delay_ms) == (2, 1.5)


def test_next_window_starts_empty_where_the_last_one_ended() -> None:
    window = TelemetryWindow(IDENT, start_ms=0)
    window.record(3.0, baseline=True, rows=4, optional_units_done=0)
    window.close(500, totals())
    report = window.close(900, totals())
    assert (report.window_start_ms, report.window_end_ms, report.requests) == (500, 900, 0)
    assert report.latency_ms.count == 0 and report.optional_units_shed == {}


def test_a_window_that_measured_a_requests_room_reports_it_as_v10_and_one_that_did_not_as_before(
) -> None:
    from dataclasses import replace

    import msgspec

    from schemas.codec import decode, encode
    from schemas.contract import ROOM_VERSION, SCHEMA_VERSION, WindowReport

    window = TelemetryWindow(IDENT, start_ms=0)
    measured = window.close(1_000, replace(totals(), extras_room=64))
    assert (measured.v, measured.extras_room) == (ROOM_VERSION, 64)
    assert decode(WindowReport, encode(measured)) == measured
    unmeasured = window.close(2_000, totals())
    assert unmeasured.v == SCHEMA_VERSION and unmeasured.extras_room is msgspec.UNSET
    with pytest.raises(ValueError, match="extras_room"):  # a v2 report that carries it
        decode(WindowReport, encode(unmeasured)[:-1] + b',"extras_room":64}')


def test_a_replica_running_precompute_reports_its_slices_share_per_window_as_v13() -> None:
    from dataclasses import replace

    from schemas.codec import decode, encode
    from schemas.contract import PRECOMPUTE_SHARE_VERSION, WindowReport

    window = TelemetryWindow(IDENT, start_ms=0)
    first = window.close(1_000, replace(totals(), precompute_busy_s=0.4))  # of 1 s
    second = window.close(2_000, replace(totals(), precompute_busy_s=1.1, extras_room=8))
    assert first.v == PRECOMPUTE_SHARE_VERSION
    assert first.precompute_utilisation == pytest.approx(0.4)
    assert second.precompute_utilisation == pytest.approx(0.7) and second.extras_room == 8
    assert decode(WindowReport, encode(second)) == second
    with pytest.raises(ValueError, match="precompute_utilisation"):  # a v10 report carrying it
        decode(WindowReport, encode(second).replace(b'"v":13', b'"v":10'))


def test_an_idle_window_estimates_capacity_from_the_last_service_time() -> None:
    window = TelemetryWindow(IDENT, start_ms=0)
    window.record(3.0, baseline=True, rows=8, optional_units_done=0)
    window.close(1_000, totals(rows=8, busy_s=0.004))
    report = window.close(2_000, totals(rows=8, busy_s=0.004, ms_per_unit=0.5))
    assert report.utilisation == 0.0
    assert report.capacity_rps == pytest.approx(2000.0 / 8)  # 2000 rows/s, 8 rows a request


def test_refused_requests_do_not_shrink_the_capacity_estimate() -> None:
    """A powerful replica that refuses a request (503) spends nothing on it: counting its
    rows into the request size would make an overloaded replica look smaller each window,
    and cut SBM's coverage by more than the work it refused."""
    window = TelemetryWindow(IDENT, start_ms=0)
    window.close(0, totals())
    for _ in range(4):
        window.record(20.0, baseline=False, rows=50, optional_units_done=50)  # served, trimmed
    for _ in range(4):
        window.record(0.0, baseline=False, rows=272, optional_units_done=0)   # refused
    report = window.close(1_000, totals(rows=200, busy_s=0.1))
    assert report.requests == 8
    # 200 rows in 0.1 busy seconds = 2000 rows/s; the served requests cost 50 rows each.
    assert report.capacity_rps == pytest.approx(40.0)


def test_a_whole_requests_capacity_counts_its_base_rows_not_the_extras_fitted_into_idle_time(
) -> None:
    """A powerful replica drops a request's extras for the next request's base: a replica
    that counted them would report fewer requests than it can serve, and hold SBM's coverage
    down by work that never displaces a request."""
    window = TelemetryWindow(IDENT, start_ms=0)
    window.close(0, totals())
    for _ in range(4):
        window.record_whole(20.0, base_rows=16, kept_rows=50)
    report = window.close(1_000, totals(rows=200, busy_s=0.1))
    # 200 rows in 0.1 busy seconds = 2000 rows/s; a request's base is 16 rows.
    assert report.capacity_rps == pytest.approx(2000.0 / 16)
    assert report.optional_units_done == 200
