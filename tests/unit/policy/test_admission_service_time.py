"""Admission's service time: what it learns from measured batches (per-unit cost and pass
overhead, steady under one slow batch) and, before the first, from the warm-up passes."""

from __future__ import annotations

import pytest

from workers.policy.admission import Admission, AdmissionConfig

FAR = 1_000_000
CFG = AdmissionConfig(max_queue_delay_ms=10.0, initial_ms_per_unit=1.0,
                      level_fractions=(0.25, 0.5), max_optional_items=100)


def make() -> Admission[str]:
    return Admission(CFG)


def test_measured_service_time_drives_the_delay_prediction() -> None:
    adm = make()
    adm.admit_baseline("b", now_ms=0, units=4)
    batch = adm.next_batch(max_units=10, now_ms=0)
    assert adm.state(0).in_flight_units == 4
    adm.record_service(units=sum(w.units for w in batch), elapsed_ms=12.0)  # 3 ms per unit
    assert adm.state(0).in_flight_units == 0
    assert adm.state(0).ms_per_unit == pytest.approx(3.0)
    adm.admit_baseline("b2", now_ms=0, units=5)
    assert adm.predicted_delay_ms() == pytest.approx(15.0)


def test_batch_overhead_is_learned_so_long_queues_are_not_overestimated() -> None:
    adm: Admission[str] = Admission(CFG, batch_units=50)
    for _ in range(40):  # each pass costs 2 ms plus 0.5 ms a row
        adm.record_service(10, 2.0 + 10 * 0.5)
        adm.record_service(50, 2.0 + 50 * 0.5)
    state = adm.state(0)
    assert state.batch_overhead_ms == pytest.approx(2.0, abs=1e-6)
    assert state.ms_per_unit == pytest.approx(0.5, abs=1e-6)
    adm.admit_baseline("b", now_ms=0, units=100)  # two passes of 50
    assert adm.predicted_delay_ms() == pytest.approx(2 * 2.0 + 100 * 0.5)


def test_one_slow_small_batch_barely_moves_the_estimate() -> None:
    adm: Admission[str] = Admission(CFG, batch_units=64)
    for _ in range(50):
        adm.record_service(64, 6.4)  # 0.1 ms a row
    adm.record_service(8, 20.0)  # a hiccup: 2.5 ms a row on a tiny batch
    assert adm.state(0).ms_per_unit < 0.2


def test_timed_warm_up_passes_replace_the_prior_before_the_first_batch() -> None:
    """A lent replica in a small CPU slice costs far more a row than the configured prior;
    its warm-up passes, timed, are what its first requests are admitted on."""
    adm: Admission[str] = Admission(AdmissionConfig(initial_ms_per_unit=0.05))
    adm.calibrate([(16, 8.0), (32, 16.0), (64, 32.0)])
    assert adm.service.per_unit_ms == pytest.approx(0.5)
    adm.calibrate([(0, 5.0), (8, -1.0)])          # nothing to learn from: ignored
    assert adm.service.per_unit_ms == pytest.approx(0.5)


def test_in_flight_work_counts_toward_the_predicted_wait() -> None:
    adm = make()
    adm.admit_baseline("b", now_ms=0, units=8)
    adm.next_batch(max_units=8, now_ms=0)
    assert adm.predicted_delay_ms() == 8.0
    assert adm.admit_optional("o", value=1.0, deadline_ms=FAR, now_ms=0, units=3) is False
    assert adm.shed_units == {"overload": 3}


def test_optional_room_is_what_fits_behind_baseline_and_in_flight_work() -> None:
    adm = make()
    assert adm.optional_room() == 10                     # 10 ms bound at 1 ms per unit
    adm.admit_baseline("b", now_ms=0, units=3)
    adm.admit_optional("o", value=1.0, deadline_ms=FAR, now_ms=0, units=4)
    assert adm.optional_room() == 7                      # queued optional work may give way
    adm.next_batch(max_units=3, now_ms=0)
    adm.admit_baseline("b2", now_ms=0, units=12)
    assert adm.optional_room() == 0


# -- deadline -----------------------------------------------------------------------------------
