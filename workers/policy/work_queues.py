"""The two queues of one worker and the order a forward pass takes work from them.

Baseline work waits in arrival order and optional work in value order
(``optional_queue``). A pass takes every baseline item that fits first, and optional work
only once no baseline waits, so optional work never delays baseline work (DESIGN invariant
1). What enters and what is shed is ``Admission``'s; this keeps the order. Pure.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from workers.policy.admission_state import Admitted
from workers.policy.optional_queue import OptionalQueue

T = TypeVar("T")


class WorkQueues(Generic[T]):
    """Baseline work first in first out, optional work by value; see the module docstring."""

    def __init__(self) -> None:
        self.baseline: deque[Admitted[T]] = deque()
        self.baseline_units = 0
        self.optional: OptionalQueue[T] = OptionalQueue()

    def add_baseline(self, item: T, units: int, now_ms: int) -> None:
        self.baseline.append(Admitted(item, False, units, now_ms))
        self.baseline_units += units

    def take(self, max_units: int) -> list[Admitted[T]]:
        """Work for one forward pass: all baseline that fits first, then optional by value.

        The first item is always taken even if it alone exceeds ``max_units``, so large
        requests are never starved; after that, taking stops at the first item that does not
        fit (skipping it would let small low-value work overtake large high-value work).
        """
        batch: list[Admitted[T]] = []
        used = 0
        while self.baseline and (not batch or used + self.baseline[0].units <= max_units):
            work = self.baseline.popleft()
            self.baseline_units -= work.units
            batch.append(work)
            used += work.units
        while self.optional.items and not self.baseline:
            entry = self.optional.best()
            if batch and used + entry.units > max_units:
                break
            self.optional.remove(entry)
            batch.append(Admitted(entry.item, True, entry.units, entry.enqueued_ms, entry.value))
            used += entry.units
        return batch

    def baseline_age_ms(self, now_ms: int) -> int:
        """How long the oldest queued baseline work has waited (0: none waits)."""
        return now_ms - self.baseline[0].enqueued_ms if self.baseline else 0

    def oldest_enqueued_ms(self) -> int | None:
        """When the oldest queued work arrived (the batcher's wait is measured from it)."""
        stamps = [self.baseline[0].enqueued_ms] if self.baseline else []
        optional = self.optional.oldest_enqueued_ms()
        if optional is not None:
            stamps.append(optional)
        return min(stamps) if stamps else None

    @property
    def units(self) -> int:
        return self.baseline_units + self.optional.units

    @property
    def items(self) -> int:
        return len(self.baseline) + self.optional.items
