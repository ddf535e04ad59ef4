"""`workers.policy.sampling`: which decision records a client logs, and with what
probability."""

from __future__ import annotations

import pytest

from workers.policy.holdout import holdout_fraction_of
from workers.policy.sampling import decision_inclusion, sample_point

IDS = [f"eu1-{i}" for i in range(20_000)]


def test_the_sample_is_a_pure_function_of_the_request_id() -> None:
    assert [sample_point(r) for r in IDS[:50]] == [sample_point(r) for r in IDS[:50]]
    assert all(0.0 <= sample_point(r) < 1.0 for r in IDS[:50])


@pytest.mark.parametrize("rate", [0.01, 0.1, 0.5])
def test_about_rate_of_the_treated_requests_are_logged_at_that_probability(rate: float) -> None:
    logged = [decision_inclusion(r, rate, False) for r in IDS]
    kept = [p for p in logged if p is not None]
    assert set(kept) == {rate}
    sd = (rate * (1 - rate) / len(IDS)) ** 0.5
    assert abs(len(kept) / len(IDS) - rate) < 4 * sd


def test_holdout_and_full_logging_log_every_record_at_probability_one() -> None:
    assert all(decision_inclusion(r, 0.01, True) == 1.0 for r in IDS[:200])
    assert all(decision_inclusion(r, 1.0, False) == 1.0 for r in IDS[:200])


def test_the_sample_is_independent_of_the_holdout_hash() -> None:
    """The holdout (first 10% by its hash) is sampled at the same rate as the rest would be:
    the two hashes are personalised apart."""
    holdout = [r for r in IDS if holdout_fraction_of(r) < 0.1]
    share = sum(sample_point(r) < 0.1 for r in holdout) / len(holdout)
    assert abs(share - 0.1) < 4 * (0.1 * 0.9 / len(holdout)) ** 0.5
