"""Planning the scope's capacity between the levers (``streams.control.planner``)."""

from __future__ import annotations

import pytest

from streams.control.allocator import AVERAGE
from streams.control.config import ControlConfig, with_overrides
from streams.control.cost import CostModel
from streams.control.inventory import CapacityVector
from streams.control.planner import Planner, UnitRates, demand_units, grid_up, speeds, unit_rates
from tests.unit.control.test_cost import window

CONFIG = ControlConfig()
RATES = UnitRates(rma_units_per_accel_s=1_000.0, sbm_rps_per_accel=10.0)


def test_grid_up_rounds_up_to_a_sixteenth_of_an_octave_and_keeps_zero() -> None:
    assert grid_up(0.0) == 0.0
    assert grid_up(4.0) == 4.0
    assert 5.0 <= grid_up(5.0) <= 5.0 * 2 ** (1 / 16)


def test_without_measurements_a_unit_buys_the_configured_rates() -> None:
    rates = unit_rates(CostModel(CONFIG.cost), CONFIG)
    assert rates.rma_units_per_accel_s == pytest.approx(
        CONFIG.cost.target_utilisation * CONFIG.rma.candidates_per_accel_unit_s)
    assert rates.sbm_rps_per_accel == pytest.approx(CONFIG.sbm.powerful_rps_per_accel_unit)


def test_no_traffic_means_no_demand_for_either_lever() -> None:
    assert demand_units(CONFIG, RATES, 100.0, 0.0, 0.0) == (0.0, 0.0)


def test_demand_grows_with_the_traffic_each_lever_would_serve() -> None:
    low = demand_units(CONFIG, RATES, 100.0, 10.0, 20.0)
    high = demand_units(CONFIG, RATES, 100.0, 40.0, 80.0)
    assert high[0] > low[0] > 0.0 and high[1] > low[1] > 0.0


def test_a_lever_gets_no_more_than_its_demand() -> None:
    planner = Planner(CONFIG)
    capacity = CapacityVector(cpu_units=1_000.0, accel={"a100": 100.0})
    allocation = planner.allocate(capacity, (2.0, 3.0))
    assert allocation.rma_accel_units <= 2.0 + 1e-9
    assert allocation.sbm_accel_units <= 3.0 + 1e-9
    assert planner.allocation is allocation


def test_configured_curves_are_used_until_both_levers_are_measured_or_if_not_allowed() -> None:
    assert not Planner(CONFIG).curves_learned  # nothing measured yet
    assert not Planner(with_overrides(CONFIG, {"allocator.learn_curves": False})).curves_learned


def test_units_are_priced_by_type_unless_the_operator_turns_it_off() -> None:
    cost = CostModel(CONFIG.cost)
    for _ in range(20):
        cost.observe([window(1.0, 30_000, pool="eu1/rank/baseline/a100/opportunistic"),
                      window(1.0, 6_000, pool="eu1/rank/baseline/t4/opportunistic")], 5.0)
    capacity = CapacityVector(cpu_units=8.0, accel={"a100": 2.0, "t4": 2.0})
    priced = speeds(cost, CONFIG, capacity)
    assert priced.rma["a100"] > 1.0 > priced.rma["t4"] and priced.sbm == {}
    off = with_overrides(CONFIG, {"cost.per_accelerator": "false"})
    assert speeds(cost, off, capacity) == AVERAGE
