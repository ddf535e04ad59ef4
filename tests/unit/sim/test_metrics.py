"""What a simulation measured (``sim.metrics``): SLA windows judged on the ranking p99 against
the SLA and the powerful p99 against the deadline, the timeline, and the summary's counts."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Literal

from schemas.contract import ControlTargets, LimitReason, RmaTarget, SbmTarget
from sim.metrics import TIMELINE_COLUMNS, LimitTally, Metrics, read_timeline


def _metrics() -> tuple[Metrics, io.StringIO]:
    timeline = io.StringIO()
    return Metrics({"eu1": 50.0}, timeline, 1_000, deadlines={"eu1": 100.0}), timeline


def _close(metrics: Metrics, end: int) -> None:
    metrics.close_window(end, "eu1", extra_target=10, coverage=0.5, opportunistic_replicas=2,
                         shed_total=0)


def _targets(reason: Literal["period", "preemption"], rma: LimitReason | None,
             sbm: LimitReason | None) -> ControlTargets:
    return ControlTargets(scope="eu1", epoch=1, issued_at_ms=0, ttl_ms=1000, reason=reason,
                          rma=RmaTarget(extra_candidates=0, budget_units_per_s=0.0,
                                        limited_by=rma),
                          sbm=SbmTarget(coverage=0.0, limited_by=sbm))


def test_a_window_is_violated_by_a_ranking_p99_over_the_sla() -> None:
    metrics, _ = _metrics()
    for latency in (10.0,) * 98 + (60.0,) * 2:
        metrics.ranking_done("eu1", latency, latency, 1_000.0, 0, 0.0)
    _close(metrics, 2_000)
    region = metrics.regions["eu1"]
    assert (region.windows, region.violations, region.worst_p99 > 50.0) == (1, 1, True)


def test_a_window_is_violated_by_powerful_answers_over_the_deadline_given_up_on_or_not() -> None:
    metrics, _ = _metrics()
    metrics.ranking_done("eu1", 10.0, 10.0, 1_000.0, 0, 0.0)
    metrics.powerful_answered("eu1", 150.0, abandoned=True)
    _close(metrics, 2_000)
    region = metrics.regions["eu1"]
    assert (region.violations, region.abandoned, region.worst_powerful_p99) == (1, 1, 150.0)


def test_an_empty_window_is_not_judged_but_has_its_timeline_row() -> None:
    metrics, timeline = _metrics()
    _close(metrics, 2_000)
    assert metrics.regions["eu1"].windows == 0
    lines = timeline.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("1,eu1,0,")


def test_a_slow_ranking_answer_is_a_rejected_request_that_earns_nothing() -> None:
    metrics, _ = _metrics()
    metrics.ranking_done("eu1", 1_500.0, 1_500.0, 1_000.0, 20, 0.3)
    metrics.ranking_done("eu1", 10.0, 10.0, 1_000.0, 20, 0.3)
    summary = metrics.summary()
    assert summary["baseline_requests_rejected"] == 1
    assert summary["optional_units_done"] == 20
    assert summary["incremental_value_by_lever"] == {"rma": 0.3, "sbm": 0.0}


def test_powerful_requests_earn_the_segment_gain_and_their_extras_value() -> None:
    metrics, _ = _metrics()
    metrics.powerful_done("eu1", 40.0, 60, 0.2, 0.05)
    summary = metrics.summary()
    assert summary["incremental_value_by_lever"] == {"rma": 0.05, "sbm": 0.2}
    assert summary["regions"]["eu1"]["powerful_served"] == 1
    assert summary["requests"] == 1


def test_work_before_the_first_notice_and_the_notice_to_shed_time() -> None:
    metrics, _ = _metrics()
    metrics.ranking_done("eu1", 10.0, 10.0, 1_000.0, 5, 0.1)
    metrics.notice_issued(3_000)
    metrics.notice_applied(3_000, 3_004.5)
    metrics.ranking_done("eu1", 10.0, 10.0, 1_000.0, 7, 0.1)
    summary = metrics.summary()
    assert summary["optional_units_done_before_first_notice"] == 5
    assert (summary["first_notice_s"], summary["max_notice_to_shed_ms"]) == (2.0, 4.5)


def test_only_period_targets_count_in_the_limit_tally_and_the_latest_goes_on_the_timeline(
        tmp_path: Path) -> None:
    tally = LimitTally()
    tally.add(_targets("period", "sla", None))
    tally.add(_targets("preemption", "preemption", "preemption"))
    assert tally.as_dict() == {"rma": {"sla": 1}, "sbm": {}}
    path = tmp_path / "timeline.csv"
    with path.open("w", encoding="utf-8", newline="") as fh:
        metrics = Metrics({"eu1": 50.0}, fh, 1_000)
        metrics.targets_emitted(_targets("period", "budget", "capacity"))
        _close(metrics, 2_000)
    [row] = read_timeline(path)
    assert list(row) == list(TIMELINE_COLUMNS)
    assert (row["rma_limited_by"], row["sbm_limited_by"]) == ("budget", "capacity")
