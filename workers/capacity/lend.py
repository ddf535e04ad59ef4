"""When a replica's capacity agent grants, renews and revokes its share (pure: no clock, no I/O).

The agent beside an opportunistic replica is the one that knows the replica exists, so it
announces the replica's share of its pool itself: a ``CapacityEvent`` grant that names the
replica (v7), valid for a lease and renewed well inside it, for as long as the replica serves.
What the control plane plans on then follows the replica's life without a scheduler:

- **grant** once the share is known and the worker beside the agent is ready (its ``/readyz``
  answers 200 for the same pool); at once again when the share changes (a resized CPU quota);
- **renew** every ``renew_s``, each grant valid for ``lease_s``: an agent that dies, or a
  worker that stops answering, stops the renewals and the lease ends the share on its own, so
  a silent agent means less optional work, never more;
- **revoke** when the replica is reclaimed (the agent's own notice: a spot interruption, a
  preStop call, SIGTERM to a Kubernetes sidecar), when the agent exits (SIGTERM, SIGINT), and
  when the replica no longer lends (its pool changed, or nothing is left to lend). After a
  reclaim it never grants again: the machine is going.

Every event is decided here and confirmed by ``sent`` once the broker took it; one the broker
did not take is decided again at the next tick (a renewal carries a fresh time, a revoke is
repeated), so nothing depends on a send that failed.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from schemas.contract import REPLICA_GRANT_VERSION, CapacityEvent
from workers.capacity.platform import Share


class LendSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How long a grant holds and how often it is renewed."""

    lease_s: float = 15.0
    """A grant's validity (``expires_at_ms`` is its time plus this)."""
    renew_s: float = 5.0
    """Time between renewals: at most half the lease, so one lost renewal lapses nothing."""

    def __post_init__(self) -> None:
        if not self.renew_s > 0:
            raise ValueError(f"renew_s must be positive, got {self.renew_s}")
        if not self.lease_s >= 2 * self.renew_s:
            raise ValueError(f"lease_s ({self.lease_s:g}) must be at least twice renew_s "
                             f"({self.renew_s:g}), so one lost renewal does not lapse the grant")

    @property
    def lease_ms(self) -> int:
        return round(self.lease_s * 1000)

    @property
    def renew_ms(self) -> int:
        return round(self.renew_s * 1000)


class WorkerProbe(msgspec.Struct, frozen=True, kw_only=True):
    """What the worker beside the agent said on ``/readyz``."""

    ready: bool
    pool_id: str | None = None
    detail: str = ""


def serving(probe: WorkerProbe | None, pool_id: str) -> tuple[bool, str | None]:
    """Whether the replica serves the pool the agent lends for, and if not why. Without a
    worker to ask (``probe`` None) the agent's word is all there is."""
    if probe is None:
        return True, None
    if not probe.ready:
        return False, f"worker not ready ({probe.detail or 'no detail'}): no renewal"
    if probe.pool_id is not None and probe.pool_id != pool_id:
        return False, (f"the worker serves pool {probe.pool_id} but this agent resolved "
                       f"{pool_id}: nothing lent (give --pool {probe.pool_id})")
    return True, None


Ended = Literal["reclaimed", "stopped"]


class Lender:
    """One replica's grants; ``tick`` every poll, ``reclaim`` on its notice, ``stop`` at exit.
    Each returns the events to send, in order; ``sent`` confirms one the broker took."""

    def __init__(self, replica_id: str, settings: LendSettings | None = None) -> None:
        self.replica_id = replica_id
        self.settings = settings or LendSettings()
        self.held: dict[str, Share] = {}
        """Pools this replica may hold a grant in (sent, and no revoke taken since)."""
        self.granted: Share | None = None
        """The share of the last grant the broker took (None: none live)."""
        self.granted_ms: int | None = None
        self.ended: Ended | None = None
        self._seq = 0

    def tick(self, now_ms: int, share: Share | None, is_serving: bool) -> list[CapacityEvent]:
        """What to send now, given the replica's ``share`` (None: nothing to lend) and whether
        its worker serves: revokes of any other pool it holds, then a grant when one is due."""
        current = share if (share is not None and share.identity.lends and not self.ended
                            and (share.accelerator_units > 0 or share.cpu_units > 0)) else None
        out = [self._revoke(held, now_ms) for pool, held in sorted(self.held.items())
               if current is None or pool != current.pool_id]
        if current is not None and is_serving and self._due(current, now_ms):
            self.held[current.pool_id] = current
            out.append(self._grant(current, now_ms))
        return out

    def reclaim(self, now_ms: int) -> list[CapacityEvent]:
        """The replica is being reclaimed: revoke now, never grant again."""
        self.ended = "reclaimed"
        return self.tick(now_ms, None, False)

    def stop(self, now_ms: int) -> list[CapacityEvent]:
        """The agent exits: revoke what it may hold."""
        self.ended = self.ended or "stopped"
        return self.tick(now_ms, None, False)

    def sent(self, event: CapacityEvent) -> None:
        """The broker took ``event``."""
        if event.kind == "grant":
            held = self.held.get(event.pool_id)
            if held is not None and _units(held) == (event.accelerator_units, event.cpu_units):
                self.granted, self.granted_ms = held, event.ts_ms
            return
        self.held.pop(event.pool_id, None)
        if self.granted is not None and self.granted.pool_id == event.pool_id:
            self.granted = self.granted_ms = None

    def _due(self, share: Share, now_ms: int) -> bool:
        if self.granted is None or self.granted_ms is None:
            return True
        if (self.granted.pool_id, _units(self.granted)) != (share.pool_id, _units(share)):
            return True
        return now_ms >= self.granted_ms + self.settings.renew_ms

    def _grant(self, share: Share, now_ms: int) -> CapacityEvent:
        ident = share.identity
        return CapacityEvent(
            v=REPLICA_GRANT_VERSION, event_id=self._event_id(now_ms), ts_ms=now_ms,
            region=ident.region, pool_id=share.pool_id, kind="grant",
            accelerator=ident.accelerator, accelerator_units=share.accelerator_units,
            cpu_units=share.cpu_units, expires_at_ms=now_ms + self.settings.lease_ms,
            replica=self.replica_id)

    def _revoke(self, share: Share, now_ms: int) -> CapacityEvent:
        ident = share.identity
        return CapacityEvent(
            v=REPLICA_GRANT_VERSION, event_id=self._event_id(now_ms), ts_ms=now_ms,
            region=ident.region, pool_id=share.pool_id, kind="revoke",
            accelerator=ident.accelerator, replica=self.replica_id)

    def _event_id(self, now_ms: int) -> str:
        self._seq += 1
        return f"{self.replica_id}@{now_ms}-{self._seq}"[-200:]


def _units(share: Share) -> tuple[float, float]:
    return share.accelerator_units, share.cpu_units
