"""What a period's targets are held to (``streams.control.ceiling``): the first period after a
restart or an override's end, and the fast path, never above targets already issued."""

from __future__ import annotations

from schemas.contract import ControlTargets, OperatorOverride, RmaTarget, SbmTarget
from streams.control.ceiling import Ceiling, period_ceiling, preemption_targets

HOUR_MS = 3_600_000


def issued(extra: int = 12, coverage: float = 0.3, budget: float = 300.0,
           reason: str = "period") -> ControlTargets:
    return ControlTargets(scope="eu1", epoch=3, issued_at_ms=0, ttl_ms=30_000,
                          rma=RmaTarget(extra_candidates=extra, budget_units_per_s=budget),
                          sbm=SbmTarget(coverage=coverage, extra_candidates=4),
                          reason=reason)  # type: ignore[arg-type]


def override(ttl_ms: int) -> OperatorOverride:
    return OperatorOverride(scope="eu1", issued_at_ms=0, ttl_ms=ttl_ms, reason="incident",
                            max_extra=5)


def test_a_ceiling_names_each_levers_bound_from_the_targets_issued() -> None:
    assert Ceiling.of(issued()) == Ceiling(extra_candidates=12.0, coverage=0.3,
                                           budget_units_per_s=300.0)


def test_no_targets_issued_is_a_ceiling_of_baseline_only() -> None:
    assert Ceiling.of(None) == Ceiling(extra_candidates=0.0, coverage=0.0,
                                       budget_units_per_s=0.0)


def test_the_first_period_after_a_restart_is_held_to_the_snapshot_and_says_restart() -> None:
    held = Ceiling.of(issued())
    assert period_ceiling(held, issued(reason="operator"), None, 10) == (held, "restart")


def test_an_override_that_lapsed_holds_one_period_to_what_it_allowed() -> None:
    last = issued(extra=5, reason="operator")
    assert period_ceiling(None, last, override(ttl_ms=100), 200) == (Ceiling.of(last), "period")


def test_an_override_still_active_sets_no_ceiling_it_applies_after_the_step() -> None:
    last = issued(extra=5, reason="operator")
    assert period_ceiling(None, last, override(ttl_ms=HOUR_MS), 200) == (None, "period")


def test_an_ordinary_period_has_no_ceiling() -> None:
    assert period_ceiling(None, issued(), None, 200) == (None, "period")


def test_the_fast_path_never_raises_a_lever_above_the_last_targets() -> None:
    more = RmaTarget(extra_candidates=40, budget_units_per_s=900.0, limited_by="budget")
    clamped = preemption_targets(issued(), more, 0.9)
    assert clamped is not None
    rma, sbm = clamped
    assert rma == RmaTarget(extra_candidates=12, budget_units_per_s=300.0,
                            limited_by="preemption")
    assert (sbm.coverage, sbm.limited_by, sbm.extra_candidates) == (0.3, "preemption", 4)


def test_the_fast_path_lowers_what_remaining_capacity_no_longer_supports() -> None:
    less = RmaTarget(extra_candidates=3, budget_units_per_s=50.0)
    clamped = preemption_targets(issued(), less, 0.1)
    assert clamped is not None
    assert (clamped[0].extra_candidates, clamped[0].budget_units_per_s) == (3, 50.0)
    assert clamped[1].coverage == 0.1


def test_before_any_targets_the_fast_path_says_baseline_only() -> None:
    clamped = preemption_targets(None, RmaTarget(extra_candidates=9, budget_units_per_s=9.0),
                                 0.5)
    assert clamped is not None
    rma, sbm = clamped
    assert (rma.extra_candidates, rma.budget_units_per_s, sbm.coverage) == (0, 0.0, 0.0)
    assert rma.limited_by == sbm.limited_by == "preemption"


def test_a_repeated_notice_that_changes_nothing_emits_nothing() -> None:
    first = preemption_targets(issued(), RmaTarget(extra_candidates=3, budget_units_per_s=50.0),
                               0.1)
    assert first is not None
    rma, sbm = first
    last = ControlTargets(scope="eu1", epoch=4, issued_at_ms=0, ttl_ms=30_000, rma=rma, sbm=sbm,
                          reason="preemption")
    assert preemption_targets(last, rma, 0.1) is None
    assert preemption_targets(issued(), rma, 0.1) is not None  # not after a period's targets
