"""A whole-request replica's delay bound (``workers.policy.deadline_horizon``)."""

from __future__ import annotations

import pytest

from workers.policy.deadline_horizon import HORIZON_ALPHA, DeadlineHorizon


def test_the_first_request_sets_the_horizon_then_it_moves_slowly() -> None:
    horizon = DeadlineHorizon()
    horizon.admit(deadline_ms=300, now_ms=100)
    assert horizon.ms == 200.0
    horizon.admit(deadline_ms=500, now_ms=100)
    assert horizon.ms == pytest.approx(200.0 + HORIZON_ALPHA * 200.0)


def test_the_bound_is_the_horizon_less_the_batchers_wait_never_under_the_queue_bound() -> None:
    horizon = DeadlineHorizon()
    assert horizon.bound(25.0, 5.0) == 25.0  # no request yet
    horizon.admit(deadline_ms=100, now_ms=0)
    assert horizon.bound(25.0, 15.0) == 85.0
    assert horizon.bound(25.0, 90.0) == 25.0
