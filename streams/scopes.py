"""The control plane's edge state: one `ScopeController` per owned scope, and its stored state.

Faust owns partitions; this registry owns the controllers of the scopes hashed to them. A
controller's snapshot is written to a compacted changelog after every tick and every capacity
or preemption event, so whichever process owns the partition next restores integrators,
inventory, segment estimates and the epoch instead of starting over. Windows in progress and
outcomes since the last tick are deliberately not persisted: losing one period of them is
cheaper than a changelog write per report. The label join's pending decisions are kept apart,
in the store the registry is given (`streams.agents.pending` live: RocksDB and a changelog of
their own), since they grow with the request rate where the snapshot does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import msgspec

from streams.control.config import ControlConfig
from streams.control.controller import ControllerState, ScopeController
from streams.control.pending import PendingStore


class StoredScope(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A table value (as JSON): the scope's partition, when it last ticked, its state."""

    partition: int
    last_tick_ms: int
    state: ControllerState


_decoder = msgspec.json.Decoder(StoredScope)


@dataclass
class Entry:
    controller: ScopeController
    partition: int
    last_tick_ms: int


class ScopeRegistry:
    """Controllers by scope, loaded lazily from the restored changelog state.

    Each controller runs with its scope's config (``ControlConfig.for_scope``: the file's keys
    with that scope's ``[scopes.<region>]`` overrides), including its own control period.
    """

    def __init__(self, config: ControlConfig,
                 pending: Callable[[str, int], PendingStore] | None = None) -> None:
        """:param config: the control laws; each scope runs ``config.for_scope(scope)``.
        :param pending: the label join's store for a scope on a partition (the disk store
            live); None: each join keeps its decisions in the process.
        """
        self.config = config
        self.pending = pending
        self.stored: dict[str, StoredScope] = {}
        self.entries: dict[str, Entry] = {}
        self.restored_partitions: set[int] = set()
        #: Scopes whose stored state could not be used (corrupt record), with the reason.
        self.skipped: dict[str, str] = {}

    def get(self, scope: str, partition: int) -> Entry:
        entry = self.entries.get(scope)
        if entry is None:
            entry = self._load(scope, partition)
            self.entries[scope] = entry
        entry.partition = partition
        return entry

    def _load(self, scope: str, partition: int) -> Entry:
        stored = self.stored.get(scope)
        pending = None if self.pending is None else self.pending(scope, partition)
        if stored is not None:
            try:
                return Entry(ScopeController(scope, self.config.for_scope(scope), stored.state,
                                             pending), partition, stored.last_tick_ms)
            except ValueError as exc:  # a record of another scope or state version
                self.skipped[scope] = str(exc)[:300]
        return Entry(ScopeController(scope, self.config.for_scope(scope), pending=pending),
                     partition, 0)

    def save(self, scope: str) -> StoredScope:
        """Snapshot a scope's controller; the caller writes it to the changelog."""
        entry = self.entries[scope]
        stored = StoredScope(entry.partition, entry.last_tick_ms, entry.controller.snapshot())
        self.stored[scope] = stored
        return stored

    def restore(self, values: dict[str, bytes], partitions: Iterable[int]) -> dict[str, str]:
        """Take the changelog's latest values for newly assigned partitions.

        A value that does not decode (a corrupt or foreign record on the changelog) is skipped:
        that scope starts afresh, at epoch 0 and with no capacity, which only lowers optional
        work, instead of the process crashing on every assignment. Returns the skipped scopes
        with the reason, for the caller to log and count.
        """
        skipped: dict[str, str] = {}
        for scope, raw in values.items():
            try:
                self.stored[scope] = _decoder.decode(raw)
            except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
                skipped[scope] = f"{type(exc).__name__}: {exc}"[:300]
        self.skipped.update(skipped)
        self.restored_partitions.update(partitions)
        return skipped

    def scopes_on(self, partition: int) -> list[str]:
        """Scopes loaded or stored on a partition, including ones restored from the changelog."""
        found = {s for s, e in self.entries.items() if e.partition == partition}
        found.update(s for s, v in self.stored.items() if v.partition == partition)
        return sorted(found)

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop everything about revoked partitions: their next owner writes their state now."""
        lost = set(partitions)
        for scope in [s for s, e in self.entries.items() if e.partition in lost]:
            del self.entries[scope]
        for scope in [s for s, v in self.stored.items() if v.partition in lost]:
            del self.stored[scope]
        self.restored_partitions -= lost

    def due(self, entry: Entry, now_ms: int) -> bool:
        """A tick is due once per period of the scope's own config; a duplicate tick after a
        rebalance is ignored."""
        period_ms = entry.controller.config.period_ms
        return now_ms - entry.last_tick_ms >= period_ms * 0.8
