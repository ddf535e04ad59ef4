"""Where the label join keeps a scope's decisions while they wait: the store's contract.

``AttributionJoin`` (`streams.control.labels`) decides what happens to a decision and a label;
this module says what it needs from the place the decisions wait in, so that place can be
chosen by whoever builds the controller:

- ``MemoryPendingStore``, the default: an ordered dict in the process. Replay and the
  simulator use it (their runs end with the process), and so do the join's unit tests.
- The control plane's disk store (`streams.agents.pending`): RocksDB on the process's data
  directory with a compacted changelog topic, so that pending decisions cost disk, not RAM,
  at any request rate, and survive a kill -9 or a move of their partition to another process.

An entry is a ``Pending``: the decision's arrival time and the decision while it waits for its
label; once its label joined, the decision is dropped and only the arrival time kept (to tell a
duplicate or late label from an orphan until the entry expires). Entries leave the store
oldest first, by expiry (``drop_older``) or by the join's cap (``drop_oldest``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

import msgspec

from schemas.contract import RoutingOutcome


class Pending(msgspec.Struct, frozen=True):
    """One request's entry: when its decision arrived, and the decision while it waits."""

    arrived_ms: int
    #: The decision waiting for its label; None once a label joined it.
    decision: RoutingOutcome | None


class PendingStore(Protocol):
    """The pending decisions of one scope, keyed by request id, oldest first.

    One caller at a time (the scope's controller); no method blocks on the network. ``add``
    is only called for a request id the store does not hold, with an arrival time no earlier
    than the caller's clock has given before (so insertion order is arrival order, unless the
    caller's clock steps back).
    """

    def __len__(self) -> int:
        """Entries held, waiting or joined."""
        ...

    def __contains__(self, request_id: str) -> bool:
        ...

    def get(self, request_id: str) -> Pending | None:
        ...

    def add(self, request_id: str, entry: Pending) -> None:
        """Hold a new entry (the newest)."""
        ...

    def replace(self, request_id: str, entry: Pending) -> None:
        """Change a held entry (its label joined); it keeps its place in the order."""
        ...

    def drop_older(self, cutoff_ms: int) -> int:
        """Drop every entry that arrived before `cutoff_ms`; how many of them still waited."""
        ...

    def drop_oldest(self) -> bool | None:
        """Drop the oldest entry: whether it still waited (None: the store was empty)."""
        ...


class MemoryPendingStore:
    """``PendingStore`` in an ordered dict: O(1) for every call; RAM grows with the entries."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, Pending] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._entries

    def get(self, request_id: str) -> Pending | None:
        return self._entries.get(request_id)

    def add(self, request_id: str, entry: Pending) -> None:
        self._entries[request_id] = entry

    def replace(self, request_id: str, entry: Pending) -> None:
        self._entries[request_id] = entry  # an existing key keeps its place

    def drop_older(self, cutoff_ms: int) -> int:
        entries = self._entries
        waiting = 0
        while entries:
            entry = next(iter(entries.values()))
            if entry.arrived_ms >= cutoff_ms:
                break
            entries.popitem(last=False)
            waiting += entry.decision is not None
        return waiting

    def drop_oldest(self) -> bool | None:
        if not self._entries:
            return None
        _, entry = self._entries.popitem(last=False)
        return entry.decision is not None
