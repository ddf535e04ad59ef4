"""Lever allocator: split spare capacity between RMA and SBM for the most expected value.

The two levers consume different things. RMA (rank more candidates) needs CPU *and*
accelerator time, in a fixed ratio (``cpu_per_accel_for_rma`` CPU units per accelerator unit).
SBM (serve a better model) needs accelerator time only, and only on accelerator types the
powerful model runs on. Each lever's value is concave in the accelerator units it gets: a
piecewise-linear curve of segments with non-increasing value per unit (the first candidates or
the first covered requests are worth the most). Maximising a sum of concave piecewise-linear
functions under linear capacity constraints is a linear programme, solved by HiGHS
(``streams.control.lp``, deterministic).

Lent units are fungible (either model can be loaded on them) unless their pool's replicas
report which model they serve (``CapacityVector.pinned``): then they go to that model's lever
or to nothing. Planning a powerful replica's unit as RMA budget, as a fungible split would,
starves SBM of a replica that cannot rank, and pays RMA for candidates no replica can score.

Lent units are not all alike: a unit of one accelerator type may score twice what a unit of
another does. The curves and the levers' rates are in the *average* unit of a model's pools
(what ``CostModel.seconds_per_unit`` prices), and ``Speeds`` says what one unit of each type
is worth in it, measured per (model, accelerator type) (``CostModel.speeds``). So the LP
places each type's units where they buy the most. SBM may use a type its model has an
artifact for (``powerful_model_accelerators``, for units not yet serving a model) and any type
a powerful-model pool already runs on: a replica serving there is proof it can.

Two tie-breaks keep answers sensible when several allocations are worth the same: every
allocated unit costs a hair (no capacity is handed out for zero value), and RMA pays a hair
more on accelerators the powerful model can run on, so it uses the others first.
"""

from __future__ import annotations

import msgspec
import numpy as np
from msgspec import Struct

from schemas.contract import LimitReason
from streams.control.config import AllocatorConfig, Segment
from streams.control.inventory import CapacityVector
from streams.control.lp import Solver

_DIGITS = 9


class Speeds(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Work one unit of each accelerator type does for each lever, in its model's average
    unit (1.0 for a type not named: the average)."""

    rma: dict[str, float] = {}
    sbm: dict[str, float] = {}


AVERAGE = Speeds()
"""Every type's unit the average: what a controller with no per-type evidence plans with."""


class Allocation(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Capacity per lever, in units of each accelerator type. ``expected_value`` is the
    curves' value at this split; ``sbm_limit`` what kept SBM's share from being larger (see
    ``sbm_limit``); ``speeds`` what a unit of each type is worth (see ``Speeds``)."""

    rma_cpu: float = 0.0
    rma_accel: dict[str, float] = {}
    sbm_accel: dict[str, float] = {}
    expected_value: float = 0.0
    sbm_limit: LimitReason = "capacity"
    speeds: Speeds = AVERAGE

    @property
    def rma_accel_units(self) -> float:
        """RMA's units in its model's average unit (what its measured rate is per)."""
        return sum(self.rma_accel[k] * self.speeds.rma.get(k, 1.0)
                   for k in sorted(self.rma_accel))

    @property
    def sbm_accel_units(self) -> float:
        """SBM's units in its model's average unit (what its measured rate is per)."""
        return sum(self.sbm_accel[k] * self.speeds.sbm.get(k, 1.0)
                   for k in sorted(self.sbm_accel))


def sbm_ceiling(capacity: CapacityVector, config: AllocatorConfig, kind: str) -> float:
    """Units of type ``kind`` SBM may have: every unit not serving the ranking model where the
    powerful model has an artifact for the type, else those its pools already serve on."""
    if kind in config.powerful_model_accelerators:
        return capacity.accel[kind] - capacity.pinned_to("baseline", kind)
    return capacity.pinned_to("powerful", kind)


def curve_value(segments: tuple[Segment, ...], units: float) -> float:
    """Value of ``units`` accelerator units on a concave piecewise-linear curve."""
    value, left = 0.0, units
    for width, per_unit in segments:
        take = min(width, left)
        if take <= 0:
            break
        value += take * per_unit
        left -= take
    return value


def allocate(capacity: CapacityVector, config: AllocatorConfig, *,
             rma_max_units: float | None = None,
             sbm_max_units: float | None = None, speeds: Speeds = AVERAGE,
             solver: Solver | None = None) -> Allocation:
    """The value-maximising split of ``capacity`` (an empty allocation if there is nothing).

    ``rma_max_units``/``sbm_max_units`` cap a lever's accelerator units, in its average unit,
    at what current traffic can use (units past that are worth nothing, whatever the static
    curve says); ``speeds`` is what a unit of each type is worth in it. ``solver``: the
    caller's, kept across calls (a new one otherwise).
    """
    types = sorted(k for k, v in capacity.accel.items() if v > 0)
    if not types:
        return Allocation()
    powerful = set(config.powerful_model_accelerators)
    w_rma = np.array([speeds.rma.get(kind, 1.0) for kind in types])
    w_sbm = np.array([speeds.sbm.get(kind, 1.0) for kind in types])
    rma_seg, sbm_seg = config.rma_value_segments, config.sbm_value_segments
    n, nr, ns = len(types), len(rma_seg), len(sbm_seg)
    # variables: r_a (n) | s_a (n) | x_k (nr) | y_k (ns)
    size = 2 * n + nr + ns
    top = max([v for _, v in rma_seg + sbm_seg] + [1.0])
    eps = 1e-7 * top
    cost = np.zeros(size)
    cost[:2 * n] = eps
    for i, kind in enumerate(types):
        if kind in powerful:
            cost[i] += eps
    cost[2 * n:2 * n + nr] = [-v for _, v in rma_seg]
    cost[2 * n + nr:] = [-v for _, v in sbm_seg]

    a_ub = np.zeros((n + 3, size))
    b_ub = np.zeros(n + 3)
    for i, kind in enumerate(types):
        a_ub[i, i] = a_ub[i, n + i] = 1.0
        b_ub[i] = capacity.accel[kind]
    a_ub[n, :n] = config.cpu_per_accel_for_rma * w_rma  # CPU follows the candidates scored
    b_ub[n] = max(0.0, capacity.cpu_units)
    a_ub[n + 1, :n] = w_rma
    b_ub[n + 1] = _cap(rma_max_units)
    a_ub[n + 2, n:2 * n] = w_sbm
    b_ub[n + 2] = _cap(sbm_max_units)

    a_eq = np.zeros((2, size))
    a_eq[0, :n], a_eq[0, 2 * n:2 * n + nr] = w_rma, -1.0
    a_eq[1, n:2 * n], a_eq[1, 2 * n + nr:] = w_sbm, -1.0

    # a pool serving one model gives its units to that model's lever only
    upper = np.array([capacity.accel[kind] - capacity.pinned_to("powerful", kind)
                      for kind in types]
                     + [sbm_ceiling(capacity, config, kind) for kind in types]
                     + [w for w, _ in rma_seg] + [w for w, _ in sbm_seg], dtype=float)
    x = (solver or Solver()).minimise(cost, a_ub, b_ub, a_eq, np.zeros(2), np.zeros(size),
                                      upper)
    if x is None:  # never expected (zero is feasible); fail safe: no optional work
        return Allocation()
    allocation = _allocation(x, types, capacity, config, speeds)
    limit = sbm_limit(allocation.sbm_accel_units, capacity, config, sbm_max_units, speeds)
    return msgspec.structs.replace(allocation, sbm_limit=limit)


def sbm_limit(sbm_units: float, capacity: CapacityVector, config: AllocatorConfig,
              sbm_max_units: float | None, speeds: Speeds = AVERAGE) -> LimitReason:
    """Why SBM was given no more units: every accelerator it can run on is already its own
    (``capacity``); nothing more is worth covering, the traffic being all served or the
    remaining segments showing no gain on the value curve (``demand``); or the split gave the
    rest to RMA, whose curve pays more for it (``budget``). Telling these apart is what makes
    a coverage held by the value curve read as such rather than as a full pool."""
    tol = 1e-6
    usable = sum(sbm_ceiling(capacity, config, k) * speeds.sbm.get(k, 1.0)
                 for k, v in sorted(capacity.accel.items()) if v > 0)
    if sbm_units >= usable - tol:
        return "capacity"
    worth = sum(w for w, v in config.sbm_value_segments if v > 0)
    if sbm_units >= min(worth, _cap(sbm_max_units)) - tol:
        return "demand"
    return "budget"


def _allocation(x: np.ndarray, types: list[str], capacity: CapacityVector,
                config: AllocatorConfig, speeds: Speeds) -> Allocation:
    n = len(types)
    rma = {kind: _units(x[i], capacity.accel[kind] - capacity.pinned_to("powerful", kind))
           for i, kind in enumerate(types)}
    sbm = {kind: _units(x[n + i], capacity.accel[kind] - rma[kind])
           for i, kind in enumerate(types)}
    rma = {k: v for k, v in rma.items() if v > 0}
    sbm = {k: v for k, v in sbm.items() if v > 0}
    split = Allocation(rma_accel=rma, sbm_accel=sbm, speeds=speeds)
    rma_units, sbm_units = split.rma_accel_units, split.sbm_accel_units
    rma_cpu = min(round(rma_units * config.cpu_per_accel_for_rma, _DIGITS), capacity.cpu_units)
    value = (curve_value(config.rma_value_segments, rma_units)
             + curve_value(config.sbm_value_segments, sbm_units))
    return msgspec.structs.replace(split, rma_cpu=max(0.0, rma_cpu),
                                   expected_value=round(value, _DIGITS))


def _cap(units: float | None) -> float:
    return 1e18 if units is None else max(0.0, units)


def _units(raw: float, ceiling: float) -> float:
    """Solver output rounded off its float noise, never above what exists."""
    return max(0.0, min(round(float(raw), _DIGITS), ceiling))
