"""Pool inventory: how much opportunistic capacity is ours right now, by region and accelerator.

A scheduler grants capacity per pool id and renews the grant before ``expires_at_ms``; a
grant that is not renewed lapses on its own, so a silent scheduler means *less* optional work,
never more. A revoke drops the grant. A preemption notice drops the reclaimed share at once,
ahead of its deadline: the control plane must stop planning on capacity that is leaving.

A capacity agent beside one replica grants that replica's share alone (a CapacityEvent naming
its ``replica``), under its own lease: a pool's capacity is its pool-wide grant plus the live
grants of its replicas, so each agent renews, revokes and lapses its own share without
knowing of the others. A pool-wide revoke or notice drops every share of the pool; a notice
naming replicas drops their own grants and takes any units it carries beyond those off the
pool-wide grant.

Ordering across topics is not guaranteed (capacity and preemption are separate topics), so a
preemption leaves a tombstone: a grant for that pool stamped no later than the notice is stale
and is ignored instead of resurrecting capacity that has already been taken back.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from schemas.contract import CapacityEvent, PreemptionNotice
from streams.control.windows import WindowStats


class Grant(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    region: str
    accelerator: str
    accelerator_units: float
    cpu_units: float
    granted_ms: int
    expires_at_ms: int | None = None
    """None: holds until revoked or preempted (the contract's meaning of a grant without it)."""


class InventoryState(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
                     omit_defaults=True):
    grants: dict[str, Grant] = {}
    preempted_ms: dict[str, int] = {}
    """pool id -> ts of the latest preemption notice (tombstone against stale grants)."""
    replica_grants: dict[str, dict[str, Grant]] = {}
    """pool id -> replica id -> that replica's own grant (left out when empty, so a control
    plane without replica grants writes the state an older one reads)."""


class CapacityVector(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Spare capacity: CPU units and accelerator units by type (keys sorted)."""

    cpu_units: float = 0.0
    accel: dict[str, float] = {}
    pinned: dict[str, dict[str, float]] = {}
    """Of ``accel``, the units of pools whose replicas serve one model (model -> type ->
    units): a powerful-model replica cannot rank more candidates, nor a ranking replica
    serve the powerful model. The rest may go to either lever."""

    def pinned_to(self, model: str, accelerator: str) -> float:
        return self.pinned.get(model, {}).get(accelerator, 0.0)

    @property
    def accel_units(self) -> float:
        return sum(self.accel[k] for k in sorted(self.accel))


class PoolInventory:
    """Grants keyed by pool id (and by replica within it); ``available`` sums the live ones
    of a region."""

    def __init__(self, state: InventoryState | None = None, *,
                 tombstone_ms: int = 600_000) -> None:
        state = state or InventoryState()
        self._grants: dict[str, Grant] = dict(state.grants)
        self._replicas: dict[str, dict[str, Grant]] = {p: dict(r) for p, r
                                                      in state.replica_grants.items()}
        self._preempted: dict[str, int] = dict(state.preempted_ms)
        self.tombstone_ms = tombstone_ms

    def apply(self, event: CapacityEvent) -> bool:
        """Apply a grant or revoke; False when a grant was stale (older than a preemption, or
        than the grant it would replace)."""
        replica = event.replica if isinstance(event.replica, str) else None
        if event.kind == "revoke":
            if replica is None:
                self._grants.pop(event.pool_id, None)
                self._replicas.pop(event.pool_id, None)
            else:
                self._drop_replicas(event.pool_id, [replica])
            return True
        tombstone = self._preempted.get(event.pool_id)
        if tombstone is not None and event.ts_ms <= tombstone:
            return False
        held = self._grants if replica is None else self._replicas.setdefault(event.pool_id, {})
        key = event.pool_id if replica is None else replica
        current = held.get(key)
        if current is not None and event.ts_ms < current.granted_ms:
            return False
        held[key] = Grant(
            region=event.region, accelerator=event.accelerator,
            accelerator_units=event.accelerator_units, cpu_units=event.cpu_units,
            granted_ms=event.ts_ms, expires_at_ms=event.expires_at_ms)
        return True

    def preempt(self, notice: PreemptionNotice) -> None:
        """Remove the reclaimed share now.

        An empty replica list means the whole pool: its grant and every replica's. A named
        replica that granted its own share loses that grant (priced by it). Units the notice
        carries beyond those grants are subtracted from the pool-wide grant. Named replicas
        that hold no grant of their own, in a notice *without* units, cannot be priced, so the
        pool-wide grant is dropped: overestimating a loss only costs optional work.
        """
        previous = self._preempted.get(notice.pool_id, -1)
        self._preempted[notice.pool_id] = max(previous, notice.ts_ms)
        if not notice.replicas:
            self._grants.pop(notice.pool_id, None)
            self._replicas.pop(notice.pool_id, None)
            return
        own = self._replicas.get(notice.pool_id, {})
        unpriced = any(r not in own for r in notice.replicas)
        accel_priced, cpu_priced = self._drop_replicas(notice.pool_id, notice.replicas)
        grant = self._grants.get(notice.pool_id)
        if grant is None:
            return
        if notice.accelerator_units <= 0 and notice.cpu_units <= 0:
            if unpriced:
                del self._grants[notice.pool_id]
            return
        accel = grant.accelerator_units - max(0.0, notice.accelerator_units - accel_priced)
        cpu = grant.cpu_units - max(0.0, notice.cpu_units - cpu_priced)
        if accel <= 0.0 and cpu <= 0.0:
            del self._grants[notice.pool_id]
        else:
            self._grants[notice.pool_id] = msgspec.structs.replace(
                grant, accelerator_units=max(0.0, accel), cpu_units=max(0.0, cpu))

    def _drop_replicas(self, pool_id: str, replicas: list[str]) -> tuple[float, float]:
        """Drop these replicas' own grants of ``pool_id``; the units they held."""
        own = self._replicas.get(pool_id)
        if not own:
            return 0.0, 0.0
        dropped = [own.pop(r) for r in replicas if r in own]
        if not own:
            del self._replicas[pool_id]
        return (sum(g.accelerator_units for g in dropped), sum(g.cpu_units for g in dropped))

    def expire(self, now_ms: int) -> list[str]:
        """Drop lapsed grants and old tombstones; returns the pool ids whose pool-wide grant
        lapsed, and ``pool id#replica`` for each replica's grant that did."""
        lapsed = sorted(pool for pool, grant in self._grants.items() if _lapsed(grant, now_ms))
        for pool in lapsed:
            del self._grants[pool]
        for pool in sorted(self._replicas):
            own = self._replicas[pool]
            gone = sorted(r for r, grant in own.items() if _lapsed(grant, now_ms))
            for replica in gone:
                del own[replica]
                lapsed.append(f"{pool}#{replica}")
            if not own:
                del self._replicas[pool]
        for pool in [p for p, ts in self._preempted.items() if ts < now_ms - self.tombstone_ms]:
            del self._preempted[pool]
        return lapsed

    def available(self, region: str, now_ms: int,
                  serving: Mapping[str, str] | None = None) -> CapacityVector:
        """Live capacity of ``region`` at ``now_ms`` (lapsed grants count as gone already).
        ``serving`` (pool id -> model its replicas report) pins those pools' units."""
        cpu = 0.0
        accel: dict[str, float] = {}
        pinned: dict[str, dict[str, float]] = {}
        for pool, grant in self._live():
            if grant.region != region or _lapsed(grant, now_ms):
                continue
            cpu += grant.cpu_units
            if grant.accelerator_units > 0:
                accel[grant.accelerator] = accel.get(grant.accelerator, 0.0) + \
                    grant.accelerator_units
                model = (serving or {}).get(pool)
                if model is not None:
                    by_type = pinned.setdefault(model, {})
                    by_type[grant.accelerator] = (by_type.get(grant.accelerator, 0.0)
                                                  + grant.accelerator_units)
        return CapacityVector(cpu_units=cpu, accel={k: accel[k] for k in sorted(accel)},
                              pinned={m: dict(sorted(pinned[m].items())) for m in sorted(pinned)})

    def _live(self) -> list[tuple[str, Grant]]:
        """Every grant held, pool-wide and per replica, in a fixed order (pool id, then the
        pool-wide grant, then replicas by id), so sums are the same float in every process."""
        held = [(pool, "", grant) for pool, grant in self._grants.items()]
        held += [(pool, replica, grant) for pool, own in self._replicas.items()
                 for replica, grant in own.items()]
        return [(pool, grant) for pool, _, grant in sorted(held, key=lambda h: (h[0], h[1]))]

    def grant(self, pool_id: str) -> Grant | None:
        """The pool-wide grant of ``pool_id`` (None: none; its replicas may hold their own)."""
        return self._grants.get(pool_id)

    def replica_grants(self, pool_id: str) -> dict[str, Grant]:
        """The grants ``pool_id``'s replicas hold of their own, by replica id."""
        return dict(sorted(self._replicas.get(pool_id, {}).items()))

    def knows(self, pool_id: str) -> bool:
        """Holds a grant (pool-wide or a replica's), or was reclaimed within the tombstone's
        time (it may come back)."""
        return (pool_id in self._grants or pool_id in self._replicas
                or pool_id in self._preempted)

    def serving(self, stats: list[WindowStats], last: Mapping[str, str]) -> dict[str, str]:
        """Which model each lent pool's replicas serve (``last``: the previous answer), when
        the grants say so: while every opportunistic replica reports from a pool this
        inventory knows. One reporting from a pool without a grant runs on units granted under
        another pool id, so the grants are not split by model and every unit stays fungible;
        so do those of a pool whose replicas serve both models."""
        lent = [w for w in stats if w.tier == "opportunistic"]
        if any(not self.knows(w.pool_id) for w in lent):
            return {}
        models: dict[str, set[str]] = {}
        for w in lent:
            models.setdefault(w.pool_id, set()).add(w.model)
        serving = dict(last)
        for pool, seen in models.items():
            if len(seen) == 1:
                serving[pool] = next(iter(seen))
            else:
                serving.pop(pool, None)
        return {p: serving[p] for p in sorted(serving) if self.knows(p)}

    @property
    def state(self) -> InventoryState:
        return InventoryState(
            grants={p: self._grants[p] for p in sorted(self._grants)},
            preempted_ms={p: self._preempted[p] for p in sorted(self._preempted)},
            replica_grants={p: dict(sorted(self._replicas[p].items()))
                            for p in sorted(self._replicas)})


def _lapsed(grant: Grant, now_ms: int) -> bool:
    return grant.expires_at_ms is not None and grant.expires_at_ms <= now_ms
