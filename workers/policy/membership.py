"""The live replica set a client routes to, from the replicas topic's announcements.

Pure rules, no I/O and no clock: the caller passes ``now_ms`` to every call (tests use a fake
clock, the client its wall clock), and the feed thread hands announcements and tombstones in.

A replica is routable while its latest announcement says ``serving`` and its lease has not run
out. It leaves the set at once when it says ``draining`` (a reclaim reached it: the client must
stop sending before the deadline, not at it), when its tombstone arrives (a clean stop), or
when its lease runs out (killed outright, partitioned away: nobody renews it). An announcement
older than the one held for that replica (a redelivery, a read-back after a restart) changes
nothing.

Leases are on the replica's clock. As for targets (``workers.policy.targets``), the receiver
estimates how far its clock runs ahead of each sender's as the smallest lag (receipt less send
time) among that sender's earlier announcements, bounded by ``max_clock_skew_ms``; the one being
judged never vouches for itself. So a skewed client drops a replica neither early nor late.

``routable(model, now_ms)`` is on every request's path: it returns a cached tuple until the set
changes or the earliest lease in it runs out.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import msgspec

from schemas.contract import ModelKind, PreemptionNotice, ReplicaAnnouncement
from workers.policy.replica import notice_reaches

#: Announcements per replica the clock offset to it is estimated over.
OFFSET_SAMPLES = 16


class MembershipLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What this client believes of an announcement at most, whatever the replica says."""

    #: A lease longer than this is cut to it: a replica that stops renewing is gone by then.
    max_lease_ms: int = 120_000
    max_clock_skew_ms: int = 5_000


@dataclass
class _Member:
    last: ReplicaAnnouncement
    expires_at_ms: int
    lags: deque[int] = field(default_factory=lambda: deque(maxlen=OFFSET_SAMPLES))


class Membership:
    """The replicas of one region, as the announcements describe them (see module docstring)."""

    def __init__(self, region: str | None = None,
                 limits: MembershipLimits | None = None) -> None:
        """``region``: only replicas of this region are routed to (None: any region)."""
        self.region = region
        self.limits = limits or MembershipLimits()
        self.counters: dict[str, int] = {}
        self._members: dict[str, _Member] = {}
        self._cache: dict[ModelKind, tuple[tuple[str, ...], int]] = {}

    def offer(self, announcement: ReplicaAnnouncement, now_ms: int) -> str:
        """Take one announcement; returns (and counts) what it did to the set."""
        a = announcement
        if self.region is not None and a.region != self.region:
            return self._bump("other_region")
        lag = now_ms - a.ts_ms
        if lag < -self.limits.max_clock_skew_ms:
            return self._bump("from_future")
        member = self._members.get(a.replica_id)
        if member is not None and a.ts_ms < member.last.ts_ms:
            return self._bump("older")
        before = _offset(member.lags, self.limits) if member is not None else 0
        lags = member.lags if member is not None else deque(maxlen=OFFSET_SAMPLES)
        lags.append(lag)
        offset = min(before, _offset(lags, self.limits))
        lease_ms = min(a.lease_expires_at_ms - a.ts_ms, self.limits.max_lease_ms)
        expires = a.ts_ms + offset + lease_ms
        self._members[a.replica_id] = _Member(a, expires, lags)
        self._cache.clear()
        if expires <= now_ms:
            return self._bump("expired")
        return self._bump(a.state)

    def withdraw(self, replica_id: str) -> str:
        """A tombstone: the replica stopped cleanly and leaves the set now."""
        gone = self._members.pop(replica_id, None)
        self._cache.clear()
        return self._bump("tombstone" if gone is not None else "tombstone_unknown")

    def routable(self, model: ModelKind, now_ms: int) -> tuple[str, ...]:
        """Endpoints of the ``serving`` replicas of ``model`` whose lease holds at ``now_ms``,
        in replica-id order (so every client walks them alike)."""
        cached = self._cache.get(model)
        if cached is not None and now_ms < cached[1]:
            return cached[0]
        live = sorted((rid, m) for rid, m in self._members.items()
                      if m.last.model == model and m.last.state == "serving"
                      and now_ms < m.expires_at_ms)
        endpoints = tuple(m.last.endpoint for _, m in live)
        valid_until = min((m.expires_at_ms for _, m in live), default=2**62)
        self._cache[model] = (endpoints, valid_until)
        return endpoints

    def reclaimed(self, notice: PreemptionNotice, now_ms: int) -> tuple[str, ...]:
        """Endpoints of the live replicas ``notice`` reaches (``notice_reaches``, the rule the
        replica itself applies) whose lease holds, draining ones too: an earlier notice
        already turned them, and a repeated one still goes to each."""
        return tuple(m.last.endpoint for rid, m in sorted(self._members.items())
                     if notice_reaches(notice, m.last.pool_id, rid)
                     and now_ms < m.expires_at_ms)

    def members(self) -> dict[str, ReplicaAnnouncement]:
        """The latest announcement of every replica heard of and not withdrawn."""
        return {rid: m.last for rid, m in self._members.items()}

    def forget_expired(self, now_ms: int) -> int:
        """Drop replicas whose lease ran out long ago (a lease's length past it), so a client
        that outlives many replicas holds no row for each. Returns how many went."""
        gone = [rid for rid, m in self._members.items()
                if now_ms >= m.expires_at_ms + self.limits.max_lease_ms]
        for rid in gone:
            del self._members[rid]
        if gone:
            self._cache.clear()
        return len(gone)

    def _bump(self, reason: str) -> str:
        self.counters[reason] = self.counters.get(reason, 0) + 1
        return reason


def _offset(lags: deque[int], limits: MembershipLimits) -> int:
    """How far the receiver's clock runs ahead of a sender's: the least lag seen (least
    transit), bounded by the skew tolerance; 0 with no evidence yet."""
    if not lags:
        return 0
    bound = limits.max_clock_skew_ms
    return max(-bound, min(bound, min(lags)))
