"""What a period measured for the fast path (``streams.control.observed``)."""

from __future__ import annotations

from streams.control.inventory import PoolInventory
from streams.control.observed import Observed, observe
from streams.control.windows import WindowStats
from tests.unit.control.factories import POWERFUL_POOL, RANK_POOL


def window(pool: str, model: str, rate: float, capacity: float = 0.0) -> WindowStats:
    return WindowStats(pool_id=pool, region="eu1", model=model, tier="opportunistic",
                       accelerator="a100", start_ms=0, end_ms=10_000, reports=10, samples=1000,
                       p50_ms=10.0, p99_ms=20.0, request_rate=rate, baseline_rate=rate,
                       optional_done_rate=0.0, shed_rate=0.0, utilisation=0.5,
                       capacity_rps=capacity, enough_samples=True)


def test_traffic_is_the_ranking_rate_and_the_total_over_both_models() -> None:
    stats = [window(RANK_POOL, "baseline", 80.0), window(POWERFUL_POOL, "powerful", 20.0, 30.0)]
    seen = observe(stats, PoolInventory(), Observed(), provisioned_utilisation=0.0)
    assert (seen.ranking_rps, seen.total_rps) == (80.0, 100.0)
    assert seen.powerful_capacity == {POWERFUL_POOL: 30.0}


def test_a_powerful_pool_without_measured_capacity_is_not_counted() -> None:
    stats = [window(POWERFUL_POOL, "powerful", 20.0, 0.0)]
    seen = observe(stats, PoolInventory(), Observed(), provisioned_utilisation=0.0)
    assert seen.powerful_capacity == {}
    assert seen.powerful_rps == 0.0


def test_a_pool_reclaimed_whole_leaves_the_measured_capacity() -> None:
    seen = Observed(powerful_capacity={"a": 10.0, "b": 5.0})
    assert seen.without("a").powerful_capacity == {"b": 5.0}
    assert seen.without("a").powerful_rps == 5.0
    assert seen.without("elsewhere") is seen
