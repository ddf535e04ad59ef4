"""The baseline hedge policy: a call is waited for a share of the deadline while another
replica is left, then hedged while the budget holds one; the slow replica is skipped only
when the hedge beat it by more than its head start."""

from __future__ import annotations

import msgspec
import pytest

from workers.policy.baseline_retry import BaselineRetry, RetryConfig

HUNG = 2_000.0


def test_hedge_after_a_share_of_the_deadline_while_another_replica_is_left() -> None:
    retry = BaselineRetry(RetryConfig(), HUNG)
    assert retry.hedge_after_ms(250.0, others_left=1) == 125.0
    assert retry.hedge_after_ms(20.0, others_left=1) == 20.0      # the floor
    assert retry.hedge_after_ms(10_000.0, others_left=1) is None  # at the hung bound: no
    assert retry.hedge_after_ms(250.0, others_left=0) is None     # no replica left


def test_budget_bounds_hedges_to_burst_plus_ratio_of_requests() -> None:
    """A pool slow everywhere: every call reaches its hedge time. Hedges stop at the burst,
    then come at the ratio."""
    retry = BaselineRetry(RetryConfig(budget_ratio=0.1, budget_burst=5.0), HUNG)
    hedges = 0
    for _ in range(1_000):
        retry.request()
        hedges += retry.take_hedge()
    assert 5 + 0.1 * 1_000 - 1 <= hedges <= 5 + 0.1 * 1_000


def test_no_budget_never_hedges() -> None:
    retry = BaselineRetry(RetryConfig(budget_ratio=0.0, budget_burst=0.0), HUNG)
    retry.request()
    assert not retry.take_hedge()


def test_skip_only_when_the_hedge_beat_the_head_start() -> None:
    retry = BaselineRetry(RetryConfig(down_s=3.0), HUNG)
    assert retry.skip_s(head_start_ms=125.0, answered_ms=4.0) == 3.0   # frozen: skip it
    assert retry.skip_s(head_start_ms=50.0, answered_ms=80.0) == 0.0   # slow everywhere


def test_config_is_strict() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"attempt_share": 1.0}, RetryConfig)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"hedge": True}, RetryConfig)
