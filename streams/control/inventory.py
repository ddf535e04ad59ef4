"""Pool inventory: how much opportunistic capacity is ours right now, by region and accelerator.

The scheduler grants capacity per pool id and renews the grant before ``expires_at_ms``; a
grant that is not renewed lapses on its own, so a silent scheduler means *less* optional work,
never more. A revoke drops the grant. A preemption notice drops the reclaimed share at once,
ahead of its deadline: the control plane must stop planning on capacity that is leaving.

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


class InventoryState(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    grants: dict[str, Grant] = {}
    preempted_ms: dict[str, int] = {}
    """pool id -> ts of the latest preemption notice (tombstone against stale grants)."""


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
    """Grants keyed by pool id; ``available`` sums the live ones of a region."""

    def __init__(self, state: InventoryState | None = None, *,
                 tombstone_ms: int = 600_000) -> None:
        state = state or InventoryState()
        self._grants: dict[str, Grant] = dict(state.grants)
        self._preempted: dict[str, int] = dict(state.preempted_ms)
        self.tombstone_ms = tombstone_ms

    def apply(self, event: CapacityEvent) -> bool:
        """Apply a grant or revoke; False when a grant was stale (older than a preemption)."""
        if event.kind == "revoke":
            self._grants.pop(event.pool_id, None)
            return True
        tombstone = self._preempted.get(event.pool_id)
        if tombstone is not None and event.ts_ms <= tombstone:
            return False
        current = self._grants.get(event.pool_id)
        if current is not None and event.ts_ms < current.granted_ms:
            return False
        self._grants[event.pool_id] = Grant(
            region=event.region, accelerator=event.accelerator,
            accelerator_units=event.accelerator_units, cpu_units=event.cpu_units,
            granted_ms=event.ts_ms, expires_at_ms=event.expires_at_ms)
        return True

    def preempt(self, notice: PreemptionNotice) -> None:
        """Remove the reclaimed share now.

        With replicas named and units given, those units are subtracted from the pool's grant.
        An empty replica list means the whole pool. Replicas named *without* units cannot be
        priced, so the whole pool is dropped: overestimating a loss only costs optional work.
        """
        previous = self._preempted.get(notice.pool_id, -1)
        self._preempted[notice.pool_id] = max(previous, notice.ts_ms)
        grant = self._grants.get(notice.pool_id)
        if grant is None:
            return
        partial = bool(notice.replicas) and (notice.accelerator_units > 0
                                             or notice.cpu_units > 0)
        if not partial:
            del self._grants[notice.pool_id]
            return
        accel = max(0.0, grant.accelerator_units - notice.accelerator_units)
        cpu = max(0.0, grant.cpu_units - notice.cpu_units)
        if accel <= 0.0 and cpu <= 0.0:
            del self._grants[notice.pool_id]
        else:
            self._grants[notice.pool_id] = msgspec.structs.replace(
                grant, accelerator_units=accel, cpu_units=cpu)

    def expire(self, now_ms: int) -> list[str]:
        """Drop lapsed grants and old tombstones; returns the pool ids whose grant lapsed."""
        lapsed = sorted(pool for pool, grant in self._grants.items()
                        if grant.expires_at_ms is not None and grant.expires_at_ms <= now_ms)
        for pool in lapsed:
            del self._grants[pool]
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
        for pool in sorted(self._grants):
            grant = self._grants[pool]
            if grant.region != region:
                continue
            if grant.expires_at_ms is not None and grant.expires_at_ms <= now_ms:
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

    def grant(self, pool_id: str) -> Grant | None:
        return self._grants.get(pool_id)

    def knows(self, pool_id: str) -> bool:
        """Holds a grant, or was reclaimed within the tombstone's time (it may come back)."""
        return pool_id in self._grants or pool_id in self._preempted

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
        return InventoryState(grants={p: self._grants[p] for p in sorted(self._grants)},
                              preempted_ms={p: self._preempted[p] for p in sorted(self._preempted)})
