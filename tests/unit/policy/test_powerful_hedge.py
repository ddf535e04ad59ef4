"""The powerful hedge policy: a powerful call is hedged once it is late by a multiple of the
p95 its pool was measured at (no hedge before a window is measured, none that would come no
sooner than the powerful wait runs out), within a budget; late answers raise the p95."""

from __future__ import annotations

import msgspec
import pytest

from workers.policy.powerful_hedge import HedgeConfig, PowerfulHedge

WAIT = 150.0


def _measured(latencies: list[float], **config: float) -> PowerfulHedge:
    hedge = PowerfulHedge(HedgeConfig(window_answers=len(latencies), **config))
    for ms in latencies:
        hedge.answered(ms)
    return hedge


def test_no_hedge_before_a_window_of_answers_is_measured() -> None:
    hedge = PowerfulHedge(HedgeConfig(window_answers=100))
    for _ in range(99):
        hedge.answered(10.0)
    assert hedge.hedge_after_ms(WAIT) is None


def test_hedge_after_a_multiple_of_the_measured_p95() -> None:
    hedge = _measured([10.0] * 90 + [12.0] * 10, late_factor=3.0)
    assert hedge.hedge_after_ms(WAIT) == pytest.approx(36.0, rel=0.03)   # the sketch's 2%


def test_a_stalls_few_late_calls_do_not_lengthen_the_next_wait() -> None:
    """Seed 3's chaos run: seven calls of a window given up about 30 ms in, in one freeze, set
    a p99 wait of 100 ms for the next freeze; the p95 keeps it at 3x the answers."""
    hedge = _measured([7.0] * 193 + [30.0] * 7, late_factor=3.0)
    assert hedge.hedge_after_ms(WAIT) == pytest.approx(21.0, rel=0.03)


def test_hedge_waits_at_least_the_floor_and_never_past_the_powerful_wait() -> None:
    assert _measured([1.0] * 50, min_wait_ms=20.0).hedge_after_ms(WAIT) == 20.0
    assert _measured([60.0] * 50, late_factor=3.0).hedge_after_ms(WAIT) is None


def test_a_pool_that_got_slower_everywhere_raises_its_own_wait() -> None:
    """Calls given up late teach the next window their lower bound: the wait follows the pool
    up instead of hedging every call of it for ever."""
    hedge = _measured([10.0] * 50)
    first = hedge.hedge_after_ms(WAIT)
    for _ in range(50):
        hedge.answered(55.0)      # each given up late, 55 ms in
    assert first is not None and hedge.hedge_after_ms(WAIT) is None   # 3 x 55 > the wait


def test_budget_bounds_hedges_to_burst_plus_ratio_of_requests() -> None:
    hedge = PowerfulHedge(HedgeConfig(budget_ratio=0.1, budget_burst=5.0))
    hedges = 0
    for _ in range(1_000):
        hedge.request()
        hedges += hedge.take()
    assert 5 + 0.1 * 1_000 - 1 <= hedges <= 5 + 0.1 * 1_000


def test_no_budget_never_hedges() -> None:
    hedge = PowerfulHedge(HedgeConfig(budget_ratio=0.0, budget_burst=0.0))
    hedge.request()
    assert not hedge.take()


def test_config_refuses_a_factor_below_one() -> None:
    with pytest.raises(msgspec.ValidationError, match="late_factor"):
        msgspec.convert({"late_factor": 0.5}, HedgeConfig)
