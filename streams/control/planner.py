"""How one scope's live capacity is planned between the levers, each control period and on
every preemption notice.

Three things, in this order: what one accelerator unit buys each lever at the measured cost
(:func:`unit_rates`), how many units each lever could use at the traffic seen
(:func:`demand_units`), and the split of the live capacity between them (:class:`Planner`,
which solves the allocator's LP only for inputs it has not seen, with the value curves as
measured where the operator lets it learn them). Pure: the caller passes the capacity, the
cost model and the traffic.
"""

from __future__ import annotations

import math

import msgspec

from streams.control.allocation_memo import AllocationMemo, Curves
from streams.control.allocator import AVERAGE, Allocation, Speeds
from streams.control.config import ControlConfig
from streams.control.cost import CostModel
from streams.control.inventory import CapacityVector
from streams.control.offpolicy import GainEstimator
from streams.control.value_curves import learned_curves


class UnitRates(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What one accelerator unit may plan to do, at the measured cost."""

    rma_units_per_accel_s: float
    """Extra candidates/s, to the target utilisation."""
    sbm_rps_per_accel: float
    """Powerful-model requests/s (SBM's headroom applies on top)."""


def unit_rates(cost: CostModel, config: ControlConfig) -> UnitRates:
    """What one accelerator unit buys each lever at ``cost``'s measured price (the configured
    rates are its prior and caps)."""
    rma = config.cost.target_utilisation / cost.seconds_per_unit(
        "baseline", config.rma.candidates_per_accel_unit_s)
    sbm = 1.0 / cost.seconds_per_unit("powerful", config.sbm.powerful_rps_per_accel_unit,
                                      per="requests")
    return UnitRates(rma_units_per_accel_s=rma, sbm_rps_per_accel=sbm)


def speeds(cost: CostModel, config: ControlConfig, capacity: CapacityVector) -> Speeds:
    """What a unit of each lent accelerator type does for each lever, against its model's
    average unit, from the cost measured per (model, accelerator type)."""
    if not config.cost.per_accelerator:
        return AVERAGE
    kinds = sorted(k for k, v in capacity.accel.items() if v > 0)
    rma = cost.speeds("baseline", kinds, config.rma.candidates_per_accel_unit_s)
    sbm = cost.speeds("powerful", kinds, config.sbm.powerful_rps_per_accel_unit, per="requests")
    return Speeds(rma={k: v for k, v in rma.items() if v != 1.0},
                  sbm={k: v for k, v in sbm.items() if v != 1.0})


def grid_up(units: float, steps_per_octave: int = 16) -> float:
    """`units` rounded up to the next point of a geometric grid (0 stays 0)."""
    if units <= 0.0:
        return 0.0
    return float(2.0 ** (math.ceil(math.log2(units) * steps_per_octave) / steps_per_octave))


def demand_units(config: ControlConfig, rates: UnitRates, rma_extra: float,
                 rma_rps: float, total_rps: float) -> tuple[float, float]:
    """Accelerator units each lever could use at the last measured traffic.

    :param config: the scope's control laws.
    :param rates: what one accelerator unit buys each lever (:func:`unit_rates`).
    :param rma_extra: the most extra candidates a target may hold (``RmaPolicy.most``).
    :param rma_rps: the settled ranking request rate (``RmaPolicy.settled_rate``).
    :param total_rps: requests/s over ranking and powerful pools.

    RMA: enough to pay for ``max_extra_candidates`` on every ranking request at the settled
    rate (``RmaPolicy.settled_rate``, the median of recent periods). The cap spreads the
    budget over the last period's rate where that is lower (``RmaPolicy.cap``); demand keeps
    the median, so a one-period dip does not shrink RMA's share of the capacity. SBM: enough
    to serve ``max_coverage`` of all requests within the headroom. Capacity past these is
    worth nothing now, so the allocator does not hand it to a lever that cannot use it.
    Demand is rounded *up* to a geometric grid (steps of 1/16 octave, about 4.4%): traffic
    jitters every period, and re-solving the LP for a 1% change in demand cost a millisecond
    per tick (a third of the offline replay's time) without changing the split materially.
    """
    rma, sbm = config.rma, config.sbm
    per_unit = min(config.allocator.cpu_per_accel_for_rma * rma.candidates_per_cpu_unit_s,
                   rates.rma_units_per_accel_s)
    rma_units = rma_extra * rma_rps / per_unit
    sbm_units = sbm.max_coverage * total_rps / (sbm.headroom * rates.sbm_rps_per_accel)
    return grid_up(rma_units), grid_up(sbm_units)


class Planner:
    """One scope's allocations, and the value curves they were solved with."""

    def __init__(self, config: ControlConfig) -> None:
        """:param config: the scope's control laws (its ``allocator`` table above all)."""
        self.config = config
        self._memo = AllocationMemo()
        #: The allocator's curves as measured (None: the configured ones), set each tick.
        self._curves: Curves | None = None
        self._allocation = Allocation()

    def learn(self, estimates: GainEstimator, rates: UnitRates, request_rps: float,
              max_extra: float) -> None:
        """Measure the value curves from joined decisions, where the operator allows it
        (``[allocator] learn_curves``); until both levers are measured the configured ones
        stay (``value_curves.learned_curves``). ``max_extra``: the most extra candidates a
        target may hold (``RmaPolicy.most``), where RMA's curve ends."""
        if self.config.allocator.learn_curves:
            self._curves = learned_curves(
                estimates, rma_units_per_accel_s=rates.rma_units_per_accel_s,
                sbm_rps_per_accel=rates.sbm_rps_per_accel, request_rps=request_rps,
                max_extra=max_extra)

    def allocate(self, capacity: CapacityVector, demand: tuple[float, float],
                 unit_speeds: Speeds = AVERAGE) -> Allocation:
        """Split ``capacity`` between RMA and SBM, each lever given at most its ``demand``
        (:func:`demand_units`), each type's units worth ``unit_speeds`` (:func:`speeds`);
        solved only for inputs not seen before."""
        allocator = self.config.allocator
        curves = self._curves if allocator.learn_curves else None
        self._allocation = self._memo.solve(capacity, allocator, *demand, curves, unit_speeds)
        return self._allocation

    @property
    def curves_learned(self) -> bool:
        """Whether the last allocation used measured value curves (else the configured)."""
        return self._curves is not None and self.config.allocator.learn_curves

    @property
    def allocation(self) -> Allocation:
        """The last allocation solved."""
        return self._allocation
