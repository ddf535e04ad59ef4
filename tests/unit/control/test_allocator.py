from __future__ import annotations

import pytest

from streams.control.allocator import Speeds, allocate, curve_value
from streams.control.config import AllocatorConfig
from streams.control.inventory import CapacityVector

FLAT_RMA_RICH = AllocatorConfig(cpu_per_accel_for_rma=4.0, powerful_model_accelerators=("a100",),
                                rma_value_segments=((100.0, 2.0),),
                                sbm_value_segments=((100.0, 1.0),))
FLAT_SBM_RICH = AllocatorConfig(cpu_per_accel_for_rma=4.0, powerful_model_accelerators=("a100",),
                                rma_value_segments=((100.0, 1.0),),
                                sbm_value_segments=((100.0, 2.0),))


def test_accelerator_only_capacity_goes_to_sbm() -> None:
    alloc = allocate(CapacityVector(cpu_units=0.0, accel={"a100": 6.0}), FLAT_RMA_RICH)
    assert alloc.rma_accel == {} and alloc.rma_cpu == 0.0
    assert alloc.sbm_accel == {"a100": 6.0}
    assert alloc.expected_value == pytest.approx(6.0)


def test_cpu_and_accelerators_go_to_the_lever_worth_more() -> None:
    capacity = CapacityVector(cpu_units=40.0, accel={"a100": 6.0})
    rma_rich = allocate(capacity, FLAT_RMA_RICH)
    assert rma_rich.rma_accel == {"a100": 6.0} and rma_rich.rma_cpu == 24.0
    assert rma_rich.sbm_accel == {}
    sbm_rich = allocate(capacity, FLAT_SBM_RICH)
    assert sbm_rich.sbm_accel == {"a100": 6.0}
    assert sbm_rich.rma_accel == {} and sbm_rich.rma_cpu == 0.0


def test_cpu_limits_rma_in_the_fixed_ratio() -> None:
    alloc = allocate(CapacityVector(cpu_units=8.0, accel={"a100": 6.0}), FLAT_RMA_RICH)
    assert alloc.rma_accel == {"a100": 2.0} and alloc.rma_cpu == 8.0
    assert alloc.sbm_accel == {"a100": 4.0}                 # the rest still earns something


def test_accelerators_the_powerful_model_cannot_use_never_go_to_sbm() -> None:
    capacity = CapacityVector(cpu_units=0.0, accel={"t4": 8.0, "a100": 1.0})
    alloc = allocate(capacity, FLAT_SBM_RICH)
    assert alloc.sbm_accel == {"a100": 1.0}
    assert "t4" not in alloc.sbm_accel and alloc.rma_accel == {}


def test_rma_uses_accelerators_sbm_cannot_before_shared_ones() -> None:
    config = AllocatorConfig(powerful_model_accelerators=("a100",), cpu_per_accel_for_rma=1.0,
                             rma_value_segments=((4.0, 1.0),), sbm_value_segments=((4.0, 1.0),))
    alloc = allocate(CapacityVector(cpu_units=100.0, accel={"a100": 4.0, "t4": 4.0}), config)
    assert alloc.rma_accel == {"t4": 4.0}
    assert alloc.sbm_accel == {"a100": 4.0}


def test_diminishing_returns_split_capacity_between_levers() -> None:
    config = AllocatorConfig(powerful_model_accelerators=("a100",), cpu_per_accel_for_rma=1.0,
                             rma_value_segments=((2.0, 3.0), (10.0, 0.5)),
                             sbm_value_segments=((3.0, 2.0), (10.0, 0.1)))
    alloc = allocate(CapacityVector(cpu_units=100.0, accel={"a100": 6.0}), config)
    # best use: 2 units at 3.0 (RMA), 3 at 2.0 (SBM), the last at 0.5 (RMA)
    assert alloc.rma_accel == {"a100": 3.0} and alloc.sbm_accel == {"a100": 3.0}
    assert alloc.expected_value == pytest.approx(2 * 3.0 + 3 * 2.0 + 0.5)


def test_capacity_past_the_curves_is_left_unallocated() -> None:
    config = AllocatorConfig(powerful_model_accelerators=("a100",),
                             rma_value_segments=((1.0, 1.0),), sbm_value_segments=((2.0, 1.0),))
    alloc = allocate(CapacityVector(cpu_units=100.0, accel={"a100": 50.0}), config)
    assert alloc.rma_accel_units + alloc.sbm_accel_units == pytest.approx(3.0)


def test_demand_caps_bound_each_lever() -> None:
    alloc = allocate(CapacityVector(cpu_units=100.0, accel={"a100": 10.0}), FLAT_SBM_RICH,
                     sbm_max_units=2.5, rma_max_units=3.0)
    assert alloc.sbm_accel == {"a100": 2.5}
    assert alloc.rma_accel == {"a100": 3.0}


def test_nothing_to_allocate_is_an_empty_allocation() -> None:
    alloc = allocate(CapacityVector(cpu_units=12.0), AllocatorConfig())
    assert alloc.rma_cpu == 0.0 and alloc.rma_accel == {} and alloc.sbm_accel == {}


def test_increasing_marginal_value_is_rejected() -> None:
    with pytest.raises(ValueError, match="diminishing"):
        AllocatorConfig(rma_value_segments=((1.0, 1.0), (1.0, 2.0)))


def test_curve_value_is_piecewise_linear() -> None:
    segments = ((2.0, 3.0), (4.0, 1.0))
    assert curve_value(segments, 1.0) == 3.0
    assert curve_value(segments, 5.0) == 6.0 + 3.0
    assert curve_value(segments, 100.0) == 10.0


def test_sbm_limit_names_what_held_its_share_the_pool_the_split_or_the_curve() -> None:
    pool_full = allocate(CapacityVector(cpu_units=0.0, accel={"a100": 6.0}), FLAT_RMA_RICH)
    assert pool_full.sbm_limit == "capacity"
    split = allocate(CapacityVector(cpu_units=40.0, accel={"a100": 6.0}), FLAT_RMA_RICH)
    assert split.sbm_accel == {} and split.sbm_limit == "budget"
    config = AllocatorConfig(powerful_model_accelerators=("a100",),
                             rma_value_segments=((1.0, 1.0),), sbm_value_segments=((2.0, 1.0),))
    curve_done = allocate(CapacityVector(cpu_units=100.0, accel={"a100": 50.0}), config)
    assert curve_done.sbm_accel == {"a100": 2.0} and curve_done.sbm_limit == "demand"
    served = allocate(CapacityVector(cpu_units=100.0, accel={"a100": 10.0}), FLAT_SBM_RICH,
                      sbm_max_units=2.5)
    assert served.sbm_limit == "demand"


def test_units_of_a_pool_serving_one_model_go_to_that_models_lever_only() -> None:
    pinned = CapacityVector(cpu_units=100.0, accel={"a100": 6.0},
                            pinned={"baseline": {"a100": 2.0}, "powerful": {"a100": 4.0}})
    alloc = allocate(pinned, FLAT_RMA_RICH)             # RMA pays more, yet gets its pool only
    assert alloc.rma_accel == {"a100": 2.0} and alloc.sbm_accel == {"a100": 4.0}
    assert alloc.sbm_limit == "capacity"
    fungible = allocate(CapacityVector(cpu_units=100.0, accel={"a100": 6.0}), FLAT_RMA_RICH)
    assert fungible.rma_accel == {"a100": 6.0} and fungible.sbm_accel == {}


def test_units_pinned_to_ranking_leave_sbm_the_rest_and_say_it_is_capacity_bound() -> None:
    capacity = CapacityVector(cpu_units=100.0, accel={"a100": 6.0},
                              pinned={"baseline": {"a100": 5.0}})
    alloc = allocate(capacity, FLAT_SBM_RICH)
    assert alloc.sbm_accel == {"a100": 1.0} and alloc.sbm_limit == "capacity"


def test_sbm_takes_the_type_whose_unit_serves_more_of_its_requests() -> None:
    # One unit of SBM's worth to give: on an h200 unit the powerful model serves twice
    # what it serves on the average unit, so the h200 unit covers the curve's two units.
    config = AllocatorConfig(powerful_model_accelerators=("a100", "h200"),
                             cpu_per_accel_for_rma=1.0, rma_value_segments=((1.0, 0.0),),
                             sbm_value_segments=((2.0, 1.0),))
    capacity = CapacityVector(cpu_units=0.0, accel={"a100": 1.0, "h200": 1.0})
    alloc = allocate(capacity, config, speeds=Speeds(sbm={"a100": 0.5, "h200": 2.0}))
    assert alloc.sbm_accel == {"h200": 1.0}
    assert alloc.sbm_accel_units == pytest.approx(2.0)
    assert alloc.expected_value == pytest.approx(2.0)


def test_rma_budget_follows_the_work_its_units_do_not_their_count() -> None:
    config = AllocatorConfig(powerful_model_accelerators=(), cpu_per_accel_for_rma=1.0,
                             rma_value_segments=((10.0, 1.0),), sbm_value_segments=((1.0, 1.0),))
    capacity = CapacityVector(cpu_units=100.0, accel={"l4": 2.0})
    same = allocate(capacity, config)
    faster = allocate(capacity, config, speeds=Speeds(rma={"l4": 1.5}))
    assert same.rma_accel == faster.rma_accel == {"l4": 2.0}
    assert (same.rma_accel_units, faster.rma_accel_units) == (2.0, 3.0)
    assert faster.rma_cpu == pytest.approx(3.0)           # CPU follows the candidates scored


def test_a_type_a_powerful_pool_serves_on_goes_to_sbm_without_being_listed() -> None:
    # l4 is not among the types the powerful model has an artifact for, but a powerful pool
    # of l4 replicas is serving: its units are SBM's; the l4 units no model holds are not.
    capacity = CapacityVector(cpu_units=0.0, accel={"l4": 3.0},
                              pinned={"powerful": {"l4": 2.0}})
    alloc = allocate(capacity, FLAT_SBM_RICH)
    assert alloc.sbm_accel == {"l4": 2.0}
    assert alloc.sbm_limit == "capacity"
