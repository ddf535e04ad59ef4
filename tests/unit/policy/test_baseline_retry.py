"""The baseline retry policy: an attempt waits a share of the deadline while another replica
is left and the budget holds a retry, else the hung bound; retries on timeouts are budgeted;
a replica is skipped only when another answered sooner."""

from __future__ import annotations

import msgspec
import pytest

from workers.policy.baseline_retry import BaselineRetry, RetryConfig

HUNG = 2_000.0


def test_attempt_waits_a_share_of_the_deadline_while_another_replica_is_left() -> None:
    retry = BaselineRetry(RetryConfig(), HUNG)
    assert retry.attempt_ms(250.0, others_left=1) == 125.0
    assert retry.attempt_ms(20.0, others_left=1) == 20.0        # the floor
    assert retry.attempt_ms(10_000.0, others_left=1) == HUNG    # never past the hung bound
    assert retry.attempt_ms(250.0, others_left=0) == HUNG       # the last replica waits


def test_retry_after_timeout_only_for_an_attempt_cut_short() -> None:
    retry = BaselineRetry(RetryConfig(), HUNG)
    assert retry.retry_after_timeout(125.0, others_left=1)
    assert not retry.retry_after_timeout(HUNG, others_left=1)   # hung: fails as before
    assert not retry.retry_after_timeout(125.0, others_left=0)


def test_budget_bounds_retries_to_burst_plus_ratio_of_requests() -> None:
    """A pool slow everywhere: every attempt times out. Retries stop at the burst, then come
    at the ratio, and attempts wait the hung bound in between."""
    retry = BaselineRetry(RetryConfig(budget_ratio=0.1, budget_burst=5.0), HUNG)
    retries = 0
    for _ in range(1_000):
        retry.request()
        wait = retry.attempt_ms(100.0, others_left=1)
        if retry.retry_after_timeout(wait, others_left=1):
            retries += 1
    assert 5 + 0.1 * 1_000 - 1 <= retries <= 5 + 0.1 * 1_000


def test_retries_in_flight_as_the_budget_ran_out_are_made_and_repaid() -> None:
    retry = BaselineRetry(RetryConfig(budget_ratio=0.5, budget_burst=1.0), HUNG)
    waits = [retry.attempt_ms(100.0, 1) for _ in range(3)]      # three attempts together
    assert waits == [50.0] * 3
    assert all(retry.retry_after_timeout(w, 1) for w in waits)  # all retried
    assert retry.tokens == -2.0
    assert retry.attempt_ms(100.0, 1) == HUNG                   # the debt first
    for _ in range(6):
        retry.request()
    assert retry.tokens == 1.0
    assert retry.attempt_ms(100.0, 1) == 50.0


def test_no_budget_never_cuts_an_attempt_short() -> None:
    retry = BaselineRetry(RetryConfig(budget_ratio=0.0, budget_burst=0.0), HUNG)
    retry.request()
    assert retry.attempt_ms(100.0, others_left=3) == HUNG


def test_skip_only_when_another_replica_answered_sooner() -> None:
    retry = BaselineRetry(RetryConfig(down_s=3.0), HUNG)
    assert retry.skip_s(waited_ms=125.0, answered_ms=4.0) == 3.0     # frozen: skip it
    assert retry.skip_s(waited_ms=50.0, answered_ms=180.0) == 0.0    # slow everywhere


def test_config_is_strict() -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"attempt_share": 1.0}, RetryConfig)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"hedge": True}, RetryConfig)
