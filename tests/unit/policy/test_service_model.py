"""The forward-pass time fit: overhead and per-unit cost from batches of varied size, and the
ratio of time to rows while sizes barely vary."""

from __future__ import annotations

import pytest

from workers.policy.service_model import ServiceModel


def test_varied_batches_recover_overhead_and_per_unit_cost() -> None:
    model = ServiceModel(initial_ms_per_unit=1.0, alpha=0.1)
    for units in [1, 8, 32, 4, 64, 16] * 20:
        model.add(units, 2.0 + 0.05 * units)
    assert model.overhead_ms == pytest.approx(2.0, rel=1e-6)
    assert model.per_unit_ms == pytest.approx(0.05, rel=1e-6)
    # 100 units in passes of at most 32: 4 passes' overhead and every unit's cost.
    assert model.drain_ms(100, 32) == pytest.approx(4 * 2.0 + 100 * 0.05)


def test_batches_of_one_size_fall_back_to_time_per_row() -> None:
    model = ServiceModel(initial_ms_per_unit=1.0, alpha=0.1)
    for _ in range(50):
        model.add(10, 5.0)
    assert model.overhead_ms == 0.0
    assert model.per_unit_ms == pytest.approx(0.5)
    assert model.drain_ms(0, 32) == 0.0


def test_timed_warm_up_passes_replace_the_prior_before_the_first_batch() -> None:
    model = ServiceModel(0.05, 0.05)
    model.calibrate([(16, 16.0), (0, 3.0), (32, -1.0), (16, 16.0)])  # empty and bad ignored
    assert model.per_unit_ms == 1.0
