"""Overload shedding is judged outside the seconds a burst onset or a notice excuses."""

from __future__ import annotations

import numpy as np
import pytest

from sim.overload import SETTLED_S, burst_onsets, excused, overload_shares


def test_a_second_at_double_the_settled_rate_is_a_burst_onset() -> None:
    arrivals = np.array([10] * SETTLED_S + [19, 20, 10, 40, 10])
    onsets = burst_onsets(arrivals)
    assert np.flatnonzero(onsets).tolist() == [SETTLED_S + 1, SETTLED_S + 3]
    assert not burst_onsets(np.zeros(5)).any()           # no settled past, no onset


def test_an_onset_or_a_notice_excuses_the_seconds_after_it() -> None:
    arrivals = np.array([10] * 20)
    arrivals[12] = 30
    marks = excused(arrivals, notice_seconds=[3, 99], excuse_s=2)
    assert np.flatnonzero(marks).tolist() == [3, 4, 5, 12, 13, 14]


def test_shares_count_overload_per_unit_done_over_the_run_and_the_steady_seconds() -> None:
    shed = np.array([0, 50, 0, 10])
    done = np.array([100, 100, 100, 100])
    shares = overload_shares(shed, done, np.array([False, True, False, False]))
    assert shares["overload_shed_share"] == pytest.approx(60 / 400, abs=1e-6)
    assert shares["overload_shed_share_steady"] == pytest.approx(10 / 300, abs=1e-6)
    assert shares["excused_seconds_share"] == pytest.approx(0.25)
    assert overload_shares(shed, np.zeros(4), np.zeros(4, dtype=bool))[
        "overload_shed_share"] is None
