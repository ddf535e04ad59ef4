"""The cost of a unit of work, learned from measured busy time: prior, robustness, decay."""

from __future__ import annotations

import pytest

from streams.control.config import CostConfig
from streams.control.cost import CostModel
from streams.control.windows import WindowStats

CFG = CostConfig(prior_weight_s=2.0, half_life_s=60.0, cap_ratio=20.0)
PRIOR = 1000.0  # units/s per accelerator unit: 1 ms a unit


def window(busy_s: float, units: int, *, pool: str = "eu1/rank/baseline/l4/opportunistic",
           model: str = "baseline", requests: int = 0) -> WindowStats:
    return WindowStats(pool_id=pool, region="eu1", model=model, tier="opportunistic",
                       accelerator=pool.split("/")[3], start_ms=0, end_ms=10_000, reports=10,
                       samples=100,
                       p50_ms=1.0, p99_ms=2.0, request_rate=1.0, baseline_rate=1.0,
                       optional_done_rate=0.0, shed_rate=0.0, utilisation=0.1,
                       capacity_rps=0.0, enough_samples=True, busy_s=busy_s, units_done=units,
                       optional_requests_done=requests)


def test_without_evidence_the_cost_is_the_prior() -> None:
    assert CostModel(CFG).seconds_per_unit("baseline", PRIOR) == pytest.approx(1e-3)


def test_evidence_outweighs_the_prior_as_it_accumulates() -> None:
    model = CostModel(CFG)
    model.observe([window(busy_s=1.0, units=10_000)], 10.0)  # 0.1 ms a unit, 1 s of evidence
    early = model.seconds_per_unit("baseline", PRIOR)
    for _ in range(10):
        model.observe([window(busy_s=1.0, units=10_000)], 10.0)
    late = model.seconds_per_unit("baseline", PRIOR)
    assert 1e-4 < late < early < 1e-3
    assert late == pytest.approx(1e-4, rel=0.35)


def test_idle_windows_and_tiny_windows_do_not_swing_the_estimate() -> None:
    model = CostModel(CFG)
    for _ in range(10):
        model.observe([window(busy_s=2.0, units=10_000)], 10.0)
    settled = model.seconds_per_unit("baseline", PRIOR)
    model.observe([window(busy_s=0.0, units=0)], 10.0)            # idle: nothing to learn
    model.observe([window(busy_s=0.05, units=2, pool="eu1/rank/baseline/l4/new")], 10.0)
    assert model.seconds_per_unit("baseline", PRIOR) == pytest.approx(settled, rel=0.05)


def test_the_estimate_stays_within_the_cap_of_the_prior() -> None:
    model = CostModel(CFG)
    for _ in range(50):
        model.observe([window(busy_s=100.0, units=1)], 10.0)  # a broken reporter
    assert model.seconds_per_unit("baseline", PRIOR) == pytest.approx(20e-3)


def test_old_evidence_decays_so_the_cost_follows_a_change() -> None:
    model = CostModel(CFG)
    for _ in range(30):
        model.observe([window(busy_s=1.0, units=10_000)], 10.0)
    for _ in range(60):
        model.observe([window(busy_s=4.0, units=10_000)], 10.0)
    assert model.seconds_per_unit("baseline", PRIOR) == pytest.approx(4e-4, rel=0.05)


def test_models_are_costed_apart_and_powerful_per_request() -> None:
    model = CostModel(CFG)
    for _ in range(20):
        model.observe([window(busy_s=1.0, units=10_000),
                       window(busy_s=5.0, units=1_000, requests=50, model="powerful",
                              pool="eu1/rank/powerful/h100/opportunistic")], 10.0)
    assert model.seconds_per_unit("baseline", PRIOR) < 2e-4
    per_request = model.seconds_per_unit("powerful", 20.0, per="requests")
    assert per_request == pytest.approx(0.1, rel=0.1)  # 5 s for 50 requests


def test_state_round_trips_and_forgotten_pools_are_dropped() -> None:
    model = CostModel(CFG)
    model.observe([window(busy_s=1.0, units=1000)], 10.0)
    again = CostModel(CFG, model.state)
    assert again.seconds_per_unit("baseline", PRIOR) == model.seconds_per_unit("baseline", PRIOR)
    for _ in range(40):
        again.observe([], 60.0)
    assert again.state == {}


def test_each_accelerator_type_is_priced_by_its_own_work_against_the_models_average() -> None:
    model = CostModel(CFG)
    for _ in range(20):  # an h100 unit scores a unit in 0.1 ms, an l4 unit in 0.4 ms
        model.observe([window(1.0, 10_000, pool="eu1/rank/baseline/h100/opportunistic"),
                       window(1.0, 2_500)], 10.0)
    speeds = model.speeds("baseline", ["h100", "l4", "a100"], PRIOR)
    # 4x measured, drawn toward the average by the prior's pseudo-evidence at its price
    assert 2.5 < speeds["h100"] / speeds["l4"] <= 4.0
    assert speeds["h100"] > 1.0 > speeds["l4"]
    assert speeds["a100"] == 1.0                            # no evidence: the average unit


def test_a_type_with_all_of_a_models_evidence_is_its_average_exactly() -> None:
    model = CostModel(CFG)
    model.observe([window(1.0, 10_000), window(0.5, 9_000,
                                               pool="eu1/rank/baseline/l4/baseline")], 10.0)
    assert model.speeds("baseline", ["l4"], PRIOR) == {"l4": 1.0}
