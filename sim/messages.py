"""Messages in flight inside a simulated step: one typed struct per kind, on one time-ordered
queue.

What the fleet is sent arrives at its own millisecond, after a delay: control targets (after
``delays.targets_ms``), a preemption notice (after its modelled delivery delay), a capacity
action due inside a step (a revoke at a notice's deadline), the deadline at which a draining
replica set leaves, and the moment a client gives up on a powerful call. Each kind has one
handler in ``sim.engine``.

Messages due at the same millisecond are delivered in the order they were sent: the queue's
key is ``(at_ms, sequence)``, and the sequence is unique, so a message itself is never
compared.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator

import msgspec

from schemas.contract import ControlTargets, PreemptionNotice
from sim.schedule import Action
from sim.worker import Request, SimWorker


class TargetsArrive(msgspec.Struct, frozen=True):
    """Control targets reach the region's workers and client."""

    targets: ControlTargets


class NoticeArrives(msgspec.Struct, frozen=True):
    """A preemption notice reaches the replicas of the region it names."""

    notice: PreemptionNotice


class CapacityDue(msgspec.Struct, frozen=True):
    """A capacity schedule's action at its own millisecond inside a step."""

    action: Action


class ReplicasLeave(msgspec.Struct, frozen=True):
    """A reclaimed replica set's deadline: it leaves, and its queued baseline work moves."""

    region: str
    worker: SimWorker


class PowerfulGivesUp(msgspec.Struct, frozen=True, eq=False):
    """The client's share of a request's deadline for the powerful call has run out before the
    answer: it stops waiting and sends the request's baseline work to the ranking pool, as the
    live client does on a timeout (the powerful replica finishes the work regardless)."""

    region: str
    request: Request


Message = TargetsArrive | NoticeArrives | CapacityDue | ReplicasLeave | PowerfulGivesUp


class MessageQueue:
    """Messages by the time they are due, then by the order they were sent."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Message]] = []
        self._seq = itertools.count()

    def send(self, at_ms: float, message: Message) -> None:
        heapq.heappush(self._heap, (at_ms, next(self._seq), message))

    def due_before(self, until: float) -> Iterator[tuple[float, Message]]:
        """(when, message) of each message due before ``until``, in order; one sent while
        this runs is yielded too if it is due before ``until``."""
        heap = self._heap
        while heap and heap[0][0] < until:
            at, _, message = heapq.heappop(heap)
            yield at, message
