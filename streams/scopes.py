"""The control plane's edge state: one `ScopeController` per owned scope, persisted in a table.

Faust owns partitions; this registry owns the controllers of the scopes hashed to them. A
controller's snapshot is written to a changelog-backed table after every tick and every capacity
or preemption event, so whichever process owns the partition next restores integrators,
inventory, segment estimates and the epoch instead of starting over. Windows in progress and
outcomes since the last tick are deliberately not persisted: losing one period of them is
cheaper than a changelog write per report.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

import msgspec

from streams.control.config import ControlConfig
from streams.control.controller import ControllerState, ScopeController


class StoredScope(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A table value (as JSON): the scope's partition, when it last ticked, its state."""

    partition: int
    last_tick_ms: int
    state: ControllerState


def _stored(value: object) -> StoredScope:
    """Table values are JSON objects (Faust's json serializer); convert strictly."""
    return msgspec.convert(value, StoredScope)


@dataclass
class Entry:
    controller: ScopeController
    partition: int
    last_tick_ms: int


class ScopeRegistry:
    """Controllers by scope, loaded lazily from `table` (scope -> StoredScope as JSON)."""

    def __init__(self, config: ControlConfig, table: MutableMapping[str, Any]) -> None:
        self.config = config
        self.table = table
        self.entries: dict[str, Entry] = {}

    def get(self, scope: str, partition: int) -> Entry:
        entry = self.entries.get(scope)
        if entry is None:
            entry = self._load(scope, partition)
            self.entries[scope] = entry
        entry.partition = partition
        return entry

    def _load(self, scope: str, partition: int) -> Entry:
        raw = self.table.get(scope)
        if raw is None:
            return Entry(ScopeController(scope, self.config), partition, 0)
        stored = _stored(raw)
        return Entry(ScopeController(scope, self.config, stored.state), partition,
                     stored.last_tick_ms)

    def save(self, scope: str) -> None:
        entry = self.entries[scope]
        stored = StoredScope(entry.partition, entry.last_tick_ms, entry.controller.snapshot())
        self.table[scope] = msgspec.to_builtins(stored)

    def scopes_on(self, partition: int) -> list[str]:
        """Scopes stored or loaded on a partition, including ones restored from the changelog."""
        found = {s for s, e in self.entries.items() if e.partition == partition}
        for scope, raw in list(self.table.items()):
            if scope not in found and _stored(raw).partition == partition:
                found.add(scope)
        return sorted(found)

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop in-memory controllers of revoked partitions; the table keeps their state."""
        lost = set(partitions)
        for scope in [s for s, e in self.entries.items() if e.partition in lost]:
            del self.entries[scope]

    def due(self, entry: Entry, now_ms: int) -> bool:
        """A tick is due once per period; a duplicate tick after a rebalance is ignored."""
        period_ms = int(self.config.period_s * 1000)
        return now_ms - entry.last_tick_ms >= period_ms * 0.8
