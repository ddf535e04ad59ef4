"""What admission reports (``workers.policy.admission_state``)."""

from __future__ import annotations

from workers.policy.admission_state import shedding_level


def test_the_shedding_level_rises_with_the_delay_against_its_bound() -> None:
    levels = [shedding_level(delay, 100.0, (0.25, 0.5)) for delay in (0.0, 24.9, 25.0, 50.0,
                                                                      99.9, 100.0)]
    assert levels == [0, 0, 1, 2, 2, 3]
