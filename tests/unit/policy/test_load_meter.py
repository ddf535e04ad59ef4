"""Offered load over a recent and a settled window: a fresh meter reads the mean rate since it
started (a new worker is not a surge), and a burst moves the recent window before the settled."""

from __future__ import annotations

import pytest

from workers.policy.load_meter import LoadMeter


def test_a_fresh_meter_reads_the_mean_rate_since_it_started() -> None:
    meter = LoadMeter(recent_ms=1_000.0, settled_ms=60_000.0)
    meter.advance(0)
    for t in range(1, 201):                     # 2 baseline units a ms for 200 ms
        meter.advance(t)
        meter.add(2.0, optional=False)
    assert meter.rate(0, optional=False) == pytest.approx(2.0, rel=0.05)
    assert meter.rate(1, optional=False) == pytest.approx(2.0, rel=0.05)
    assert meter.rate(1, optional=True) == 0.0


def test_a_burst_raises_the_recent_rate_far_more_than_the_settled() -> None:
    meter = LoadMeter(recent_ms=100.0, settled_ms=10_000.0)
    meter.advance(0)
    for t in range(1, 20_001):                  # one unit a ms for 20 s ...
        meter.advance(t)
        meter.add(1.0, optional=False)
    for t in range(20_001, 20_101):             # ... then ten a ms for 100 ms
        meter.advance(t)
        meter.add(10.0, optional=False)
    recent, settled = meter.rate(0), meter.rate(1)
    assert recent > 5.0
    assert settled < 1.2
