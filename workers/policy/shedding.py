"""Optional work that leaves a worker's queue unserved, and the count of every unit shed.

Each shed unit is counted by its reason (DESIGN invariant 4), withdrawn from the offered
load (offered, never served, so the surge rule does not count it), and its waiter is told
(``Admission.on_shed``). Which work goes is the queue's order (``optional_queue``): the
earliest deadline for ``deadline``, the lowest value for overload and surges, all of it for
``preemption``; when it goes is ``Admission``'s rules. Pure: time is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from schemas.contract import ShedReason
from workers.policy.admission_state import Admitted
from workers.policy.load_meter import LoadMeter
from workers.policy.optional_queue import OptionalQueue, Queued
from workers.policy.shed_order import REASON_DEADLINE, REASON_OVERLOAD, REASON_PREEMPTION

T = TypeVar("T")


class Shedding(Generic[T]):
    """Sheds from one optional queue and counts what is shed; see the module docstring."""

    def __init__(self, queue: OptionalQueue[T], load: LoadMeter,
                 notify: Callable[[T, ShedReason], None]) -> None:
        """:param queue: the worker's optional queue.
        :param load: its offered load, which shed work leaves.
        :param notify: told of each queued item shed (not of one refused at the door).
        """
        self.queue = queue
        self.load = load
        self._notify = notify
        #: Optional units shed, by reason.
        self.units: dict[str, int] = {}

    def count(self, reason: ShedReason, units: int = 1) -> None:
        """Count optional units shed (a reason decided elsewhere, too: stale targets)."""
        if units > 0:
            self.units[reason] = self.units.get(reason, 0) + units

    def shed(self, entry: Queued[T], reason: ShedReason) -> None:
        """Drop a queued entry for ``reason``."""
        self.queue.remove(entry)
        self.count(reason, entry.units)
        self.load.add(-entry.units, optional=True)  # offered, never served
        self._notify(entry.item, reason)

    def refuse(self, entry: Queued[T]) -> None:
        """Take back an entry just queued, refused at the door for ``overload``: counted and
        withdrawn, but nobody waits on it yet, so nobody is told."""
        self.queue.remove(entry)
        self.count(REASON_OVERLOAD, entry.units)
        self.load.add(-entry.units, optional=True)

    def expire(self, now_ms: int) -> None:
        """Shed every entry whose deadline has come (work done after it is wasted)."""
        while self.queue.items:
            entry = self.queue.earliest()
            if entry.deadline_ms > now_ms:
                return
            self.shed(entry, REASON_DEADLINE)

    def all(self, reason: ShedReason) -> int:
        """Shed every entry, highest value first; returns how many."""
        dropped = 0
        while self.queue.items:
            self.shed(self.queue.best(), reason)
            dropped += 1
        return dropped

    def stopped(self, batch: Iterable[Admitted[T]]) -> list[bool]:
        """Which answers of a batch a preemption notice came during may be used: its baseline
        answers only; each optional item's units are counted as shed for ``preemption``.

        A notice means the capacity is going: optional work in service when it came is as
        stopped as the queued work shed for it, whether its answer comes back a microsecond
        or a remote model server's round trip later, so what the clients see does not depend
        on how long the backend took. Baseline answers are always used.
        """
        usable = []
        for work in batch:
            if work.optional:
                self.count(REASON_PREEMPTION, work.units)
            usable.append(not work.optional)
        return usable
