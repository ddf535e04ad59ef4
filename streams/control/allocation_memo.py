"""The allocator's answers, remembered by their exact inputs.

The LP (``streams.control.allocator.allocate``) is deterministic, so byte-identical inputs
give the same allocation: a controller whose traffic cycles back to demand grid points it has
seen reuses the answer instead of solving again (about a third of the LPs in `surplus bench
replay`). The inputs of the last call are compared first, as they are, without encoding them.
"""

from __future__ import annotations

import msgspec

from streams.control.allocator import AVERAGE, Allocation, Speeds, allocate
from streams.control.config import AllocatorConfig
from streams.control.inventory import CapacityVector
from streams.control.lp import Solver

SOLVED_KEPT = 256
"""Allocations remembered; the oldest is forgotten past it."""

Curves = tuple[tuple[tuple[float, float], ...], tuple[tuple[float, float], ...]]


class AllocationMemo:
    """One controller's solved allocations, keyed by their inputs."""

    def __init__(self) -> None:
        self._last: tuple[tuple[object, ...], Allocation] | None = None
        self._solved: dict[bytes, Allocation] = {}
        self._solver = Solver()

    def solve(self, capacity: CapacityVector, config: AllocatorConfig, rma_max: float,
              sbm_max: float, curves: Curves | None, speeds: Speeds = AVERAGE) -> Allocation:
        """``allocate`` for these inputs, with ``curves`` (RMA's and SBM's learned value
        segments) in place of the configured ones when given."""
        key = (capacity, rma_max, sbm_max, curves, speeds)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        exact = msgspec.msgpack.encode(key)
        allocation = self._solved.get(exact)
        if allocation is None:
            if curves is not None:
                config = msgspec.structs.replace(config, rma_value_segments=curves[0],
                                                 sbm_value_segments=curves[1])
            allocation = allocate(capacity, config, rma_max_units=rma_max,
                                  sbm_max_units=sbm_max, speeds=speeds, solver=self._solver)
            if len(self._solved) >= SOLVED_KEPT:
                del self._solved[next(iter(self._solved))]
            self._solved[exact] = allocation
        self._last = (key, allocation)
        return allocation
