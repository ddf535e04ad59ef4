"""The second stage of a scaled-out scope: when a control period has all its parts.

Each first-stage shard sends one ``WindowPartial`` per scope and period (``streams.control.
shards``). The scope's owner holds them here and lets its controller close the period once
every shard it expects has spoken: a watermark over the shards, which closes a period as soon
as its last part arrives rather than at a fixed delay. A shard that stays silent (its process
died and its partition has not moved yet, a broker is away) holds the period back for at most
``grace_ms`` past its end; then the period closes on the parts there are, and the release
says which shards were missing, so the miss is counted rather than waited on for ever.

Which shards are expected: those that sent a part with reports within the last
``SHARD_MEMORY_PERIODS`` periods, as long as a shard keeps sending empty parts after its last
report. A part that comes after its period was released is late: it joins the period still
open, as a late report joins the single reader's open window. The first period after a start
waits out the grace, since the gate does not yet know which shards to expect.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.contract import WindowPartial
from streams.control.shards import SHARD_MEMORY_PERIODS, period_end


@dataclass(frozen=True, slots=True)
class Release:
    """One or more periods closed together (more than one only after the gate was not asked
    for longer than a period): their parts, by shard, and who was missing."""

    period_end_ms: int
    parts: list[WindowPartial]
    missing: tuple[str, ...]


class PeriodGate:
    """One scope's parts, held by period until they are all there or their grace runs out."""

    def __init__(self, period_ms: int, grace_ms: int, start_ms: int) -> None:
        """:param start_ms: when the scope was first seen: periods ending after it are its.
        """
        if period_ms <= 0 or grace_ms < 0:
            raise ValueError(f"period_ms {period_ms} must be > 0 and grace_ms {grace_ms} >= 0")
        self.period_ms = period_ms
        self.grace_ms = grace_ms
        self.released_until = period_end(start_ms, period_ms) - period_ms
        self.late = 0
        self._held: dict[int, list[WindowPartial]] = {}
        self._reported: dict[str, int] = {}
        self._warm = False

    def add(self, part: WindowPartial) -> None:
        """Hold one shard's part for its period (the open one, if its own was released)."""
        end = part.period_end_ms
        if end <= self.released_until:
            end = self.released_until + self.period_ms
            self.late += 1
        self._held.setdefault(end, []).append(part)
        if part.pools:
            self._reported[part.shard] = max(part.period_end_ms,
                                             self._reported.get(part.shard, 0))

    def expected(self, end_ms: int) -> set[str]:
        """The shards that should speak for the period ending at ``end_ms``."""
        since = end_ms - SHARD_MEMORY_PERIODS * self.period_ms
        return {shard for shard, last in self._reported.items() if last >= since}

    def release(self, now_ms: int) -> Release | None:
        """The periods that can close now, merged into one release (None: none can)."""
        ends: list[int] = []
        missing: set[str] = set()
        end = self.released_until + self.period_ms
        while True:
            parts = self._held.get(end, [])
            absent = self.expected(end) - {part.shard for part in parts}
            complete = self._warm and not absent and (parts or now_ms >= end)
            if not (complete or now_ms >= end + self.grace_ms):
                break
            ends.append(end)
            missing |= absent
            self._warm = True
            end += self.period_ms
        if not ends:
            return None
        self.released_until = ends[-1]
        parts = [part for e in ends for part in self._held.pop(e, [])]
        parts.sort(key=lambda part: (part.shard, part.period_end_ms))
        self._forget(ends[-1])
        return Release(ends[-1], parts, tuple(sorted(missing)))

    def _forget(self, end_ms: int) -> None:
        since = end_ms - SHARD_MEMORY_PERIODS * self.period_ms
        for shard in [s for s, last in self._reported.items() if last < since]:
            del self._reported[shard]

    @property
    def held(self) -> int:
        """Parts waiting (a bound on what a silent shard makes the gate keep)."""
        return sum(len(parts) for parts in self._held.values())
