"""What a control period measured that the fast path needs between ticks.

A preemption notice comes between ticks and must be answered at once, without the windows:
``ScopeController.on_preemption`` re-plans from what the last tick observed, less the pool
the notice reclaims. Kept in the controller's snapshot, so a restarted controller's fast
path has it too. Pure: the caller passes the closed windows.
"""

from __future__ import annotations

import msgspec

from streams.control.inventory import PoolInventory
from streams.control.rma import provisioned_headroom, ranking_request_rate
from streams.control.windows import WindowStats


class Observed(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What the last tick measured that the fast path needs between ticks."""

    ranking_rps: float = 0.0
    """Requests/s on the ranking pools (model baseline)."""
    total_rps: float = 0.0
    """Requests/s over ranking and powerful pools: the traffic SBM coverage is a share of."""
    powerful_capacity: dict[str, float] = {}
    """Measured capacity_rps per opportunistic powerful-model pool id."""
    provisioned_units_per_s: float = 0.0
    """Extra candidates/s the provisioned ranking replicas have room for (``rma``)."""
    serving: dict[str, str] = {}
    """Opportunistic pool id -> the model its replicas last reported serving (kept while the
    inventory knows the pool: granted, or reclaimed and may return): the allocator gives
    those units to that model's lever only."""

    def without(self, pool_id: str) -> Observed:
        """As observed, less the measured capacity of a pool reclaimed whole (itself when
        that pool had none measured)."""
        if pool_id not in self.powerful_capacity:
            return self
        capacity = dict(self.powerful_capacity)
        del capacity[pool_id]
        return msgspec.structs.replace(self, powerful_capacity=capacity)

    @property
    def powerful_rps(self) -> float:
        """The opportunistic powerful pools' measured capacity, summed in pool-id order."""
        return sum(self.powerful_capacity[k] for k in sorted(self.powerful_capacity))


def observe(stats: list[WindowStats], inventory: PoolInventory, before: Observed,
            provisioned_utilisation: float) -> Observed:
    """What the closed windows ``stats`` say.

    :param stats: the windows the tick closed.
    :param inventory: the scope's pools, which keeps what each opportunistic pool serves.
    :param before: what the tick before observed (a pool silent this period keeps its model).
    :param provisioned_utilisation: how busy the provisioned ranking replicas may be kept
        (``[cost] provisioned_utilisation``); their room past it is RMA's.
    """
    ranking = ranking_request_rate(stats)
    powerful = [w for w in stats if w.model == "powerful"]
    total = ranking + sum(w.request_rate for w in powerful)
    capacity = {w.pool_id: w.capacity_rps for w in powerful
                if w.tier == "opportunistic" and w.capacity_rps > 0}
    return Observed(ranking_rps=ranking, total_rps=total, powerful_capacity=capacity,
                    provisioned_units_per_s=provisioned_headroom(stats, provisioned_utilisation),
                    serving=inventory.serving(stats, before.serving))
