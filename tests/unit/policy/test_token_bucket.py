"""The optional-work budget: no rate admits everything, a fresh budget starts full, a lower rate
cuts what is banked, and tokens come back at the rate."""

from __future__ import annotations

from workers.policy.token_bucket import TokenBucket


def test_no_rate_means_no_limit() -> None:
    bucket = TokenBucket(burst_s=1.0)
    assert bucket.take(10**9, now_ms=0)


def test_a_fresh_budget_starts_full_and_refills_at_its_rate() -> None:
    bucket = TokenBucket(burst_s=0.5)
    bucket.set_rate(100.0, now_ms=0)           # 100 units/s, 0.5 s banked: 50
    assert bucket.take(50, now_ms=0)
    assert not bucket.take(1, now_ms=0)
    assert bucket.take(10, now_ms=100)          # 0.1 s at 100/s
    assert not bucket.take(1, now_ms=100)


def test_a_lower_rate_cuts_what_is_banked_to_its_own_burst() -> None:
    bucket = TokenBucket(burst_s=1.0)
    bucket.set_rate(1000.0, now_ms=0)
    bucket.set_rate(10.0, now_ms=0)
    assert bucket.take(10, now_ms=0)
    assert not bucket.take(1, now_ms=0)


def test_a_floor_banks_more_than_the_burst_of_a_low_rate() -> None:
    bucket = TokenBucket(burst_s=1.0)
    bucket.set_rate(10.0, now_ms=0, floor_units=50.0)   # 1 s is 10 units; the floor 50
    assert bucket.take(50, now_ms=0)
    assert not bucket.take(1, now_ms=0)
    assert bucket.take(10, now_ms=1_000)                # still refilled at 10 units/s
    bucket.set_rate(10.0, now_ms=1_000, floor_units=0.0)
    assert bucket.depth == 10.0


def test_a_floor_without_a_rate_banks_nothing() -> None:
    bucket = TokenBucket(burst_s=1.0)
    bucket.set_rate(0.0, now_ms=0, floor_units=50.0)
    assert not bucket.take(1, now_ms=10_000)
