"""What of a request fits under the delay bound (``workers.policy.fit``)."""

from __future__ import annotations

from workers.policy.fit import extras_that_fit, room
from workers.policy.service_model import ServiceModel


def service(ms_per_unit: float) -> ServiceModel:
    return ServiceModel(ms_per_unit, 0.05)


def test_room_is_what_drains_within_the_bound_behind_the_work_ahead() -> None:
    assert room(service(1.0), ahead=10, bound_ms=25.0, batch_units=None) == 15


def test_no_room_once_the_work_ahead_fills_the_bound() -> None:
    assert room(service(1.0), ahead=30, bound_ms=25.0, batch_units=None) == 0


def test_a_whole_request_keeps_the_extras_that_drain_within_the_bound() -> None:
    assert extras_that_fit(service(1.0), ahead=10, extra=100, bound_ms=25.0,
                           batch_units=None) == 15


def test_a_whole_request_keeps_all_its_extras_when_they_fit_and_none_when_none_do() -> None:
    assert extras_that_fit(service(1.0), ahead=0, extra=5, bound_ms=25.0, batch_units=None) == 5
    assert extras_that_fit(service(1.0), ahead=40, extra=5, bound_ms=25.0,
                           batch_units=None) == 0


def test_each_pass_overhead_counts_against_the_fit() -> None:
    model = service(1.0)
    for units in (10, 20, 10, 20):
        model.add(units, 5.0 + units)  # 5 ms a pass, 1 ms a unit
    kept = extras_that_fit(model, ahead=0, extra=100, bound_ms=40.0, batch_units=10)
    assert kept < 40  # at 1 ms a unit alone, 40 would fit
    assert model.drain_ms(kept, 10) <= 40.0 < model.drain_ms(kept + 1, 10)
