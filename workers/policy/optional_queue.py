"""The queue optional work waits in on one worker: served highest value first, shed lowest
value first, expired earliest deadline first, and its oldest arrival known to the batcher.

One concept a module, as concurrency-limits keeps its windows and measurements apart:
``Admission`` decides what enters and what is shed; this only keeps the order. Every entry
sits in three heaps and an arrival deque at once; one removed is marked dead and dropped
lazily when it reaches the top of each, and the heaps are rebuilt once dead entries
outnumber live ones four to one, so each removal costs O(log n) amortised whichever order
asked for it. Pure: times are the caller's integer milliseconds.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: Dead heap entries tolerated past four per live one before the heaps are rebuilt.
COMPACT_SLACK = 64


@dataclass(slots=True)
class Queued(Generic[T]):
    """One optional item waiting, with what orders it (``seq``: arrival order, the tie-break)."""

    seq: int
    item: T
    value: float
    units: int
    deadline_ms: int
    enqueued_ms: int
    live: bool = True


Heap = list[tuple[Any, int, Queued[T]]]


class OptionalQueue(Generic[T]):
    """Optional work in value order; see the module docstring."""

    def __init__(self) -> None:
        self._by_value: Heap[T] = []      # max-heap: serve best (earliest arrival on ties)
        self._by_low_value: Heap[T] = []  # min-heap: shed worst (latest arrival on ties)
        self._by_deadline: Heap[T] = []   # min-heap: expire first
        self._arrivals: deque[Queued[T]] = deque()  # arrival order: oldest
        self._seq = itertools.count()
        #: Live items and their units.
        self.items = 0
        self.units = 0

    def push(self, item: T, value: float, units: int, deadline_ms: int,
             now_ms: int) -> Queued[T]:
        """Queue ``item``; the entry returned identifies it to :meth:`remove`."""
        entry = Queued(next(self._seq), item, value, units, deadline_ms, now_ms)
        heapq.heappush(self._by_value, (-value, entry.seq, entry))
        heapq.heappush(self._by_low_value, (value, -entry.seq, entry))
        heapq.heappush(self._by_deadline, (deadline_ms, entry.seq, entry))
        self._arrivals.append(entry)
        self.items += 1
        self.units += units
        return entry

    def best(self) -> Queued[T]:
        """The highest-value live entry (the queue must not be empty)."""
        return self._peek(self._by_value)

    def worst(self) -> Queued[T]:
        """The lowest-value live entry, the newest among equals (not empty)."""
        return self._peek(self._by_low_value)

    def earliest(self) -> Queued[T]:
        """The live entry whose deadline comes first (not empty)."""
        return self._peek(self._by_deadline)

    def remove(self, entry: Queued[T]) -> None:
        """Take a live entry out of the queue."""
        entry.live = False
        self.items -= 1
        self.units -= entry.units
        if self.items == 0:
            self._by_value.clear()
            self._by_low_value.clear()
            self._by_deadline.clear()
            self._arrivals.clear()
        elif len(self._by_value) > 4 * self.items + COMPACT_SLACK:
            self._compact()

    def oldest_enqueued_ms(self) -> int | None:
        """When the oldest live entry arrived (None: empty)."""
        while self._arrivals and not self._arrivals[0].live:
            self._arrivals.popleft()
        return self._arrivals[0].enqueued_ms if self._arrivals else None

    def _compact(self) -> None:
        """Rebuild the heaps without dead entries (they are removed lazily otherwise)."""
        self._by_value = [t for t in self._by_value if t[2].live]
        self._by_low_value = [t for t in self._by_low_value if t[2].live]
        self._by_deadline = [t for t in self._by_deadline if t[2].live]
        self._arrivals = deque(e for e in self._arrivals if e.live)
        for heap in (self._by_value, self._by_low_value, self._by_deadline):
            heapq.heapify(heap)

    @staticmethod
    def _peek(heap: Heap[T]) -> Queued[T]:
        """The first live entry of a heap (dead ones are popped on the way)."""
        while not heap[0][2].live:
            heapq.heappop(heap)
        return heap[0][2]
