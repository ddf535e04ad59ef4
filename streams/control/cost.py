"""What one unit of optional work costs, learned from what the replicas measure.

Every WindowReport says how long the replica's model was busy (``busy_s``, replica-seconds)
and how many units (candidates) that bought (``units_done``), and how many requests had
optional work done. Per pool, the cost of a unit is the ratio of those two, summed over recent
periods with exponentially decaying weights. A ratio of sums, rather than a mean of per-window
ratios, is what makes it robust:

- an idle window (0 s for 0 units) adds nothing, where a per-window ratio would be 0/0;
- a window of a few units with a slow first batch (a replica that just joined and is still
  warming up) weighs as little as the units it scored, not as much as a busy window;
- the configured rate is the prior: ``prior_weight_s`` busy-seconds of pseudo-evidence at the
  configured cost, so the first windows move the estimate only as far as their evidence goes;
- the estimate stays within ``cap_ratio`` of the prior either way, so a broken reporter cannot
  talk the control plane into an absurd budget.

A lever's rate per accelerator unit (one replica) is then ``1 / cost``; the RMA budget plans to
fill the lent capacity to ``target_utilisation`` of its time (SBM to its ``headroom``), and the
latency controllers take it from there. On a powerful-model pool every request is optional work
done whole, so its cost is counted per request as well as per unit. Pure code: no clock, state
in and out as plain structs.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from streams.control.config import CostConfig
from streams.control.windows import WindowStats


class PoolCost(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Decayed sums of one pool's measured work (restart state)."""

    model: str = ""
    accelerator: str = ""
    """The pool's accelerator type ("" in restart state from before it was kept)."""
    busy_s: float = 0.0
    units: float = 0.0
    requests: float = 0.0


class CostModel:
    """Per-pool cost of a unit; ``observe`` once per control period with its closed windows."""

    def __init__(self, config: CostConfig, state: dict[str, PoolCost] | None = None) -> None:
        self.config = config
        self.pools: dict[str, PoolCost] = dict(state or {})

    def observe(self, stats: list[WindowStats], dt_s: float) -> None:
        """Fold one period's windows in; older evidence decays by its half-life."""
        keep = math.exp(-math.log(2.0) * max(dt_s, 0.0) / self.config.half_life_s)
        for pool_id in sorted(self.pools):
            old = self.pools[pool_id]
            if old.busy_s * keep < 1e-6:  # a pool long gone: forget it (bounded memory)
                del self.pools[pool_id]
                continue
            self.pools[pool_id] = PoolCost(model=old.model, accelerator=old.accelerator,
                                           busy_s=old.busy_s * keep, units=old.units * keep,
                                           requests=old.requests * keep)
        for w in stats:
            if w.units_done <= 0 or w.busy_s <= 0:
                continue
            old = self.pools.get(w.pool_id, PoolCost())
            self.pools[w.pool_id] = PoolCost(model=w.model, accelerator=w.accelerator,
                                             busy_s=old.busy_s + w.busy_s,
                                             units=old.units + w.units_done,
                                             requests=old.requests + w.optional_requests_done)

    def _sums(self, model: str, accelerator: str | None = None) -> PoolCost:
        busy = units = requests = 0.0
        for pool_id in sorted(self.pools):
            p = self.pools[pool_id]
            if p.model == model and accelerator in (None, p.accelerator):
                busy, units, requests = busy + p.busy_s, units + p.units, requests + p.requests
        return PoolCost(model=model, busy_s=busy, units=units, requests=requests)

    def _estimate(self, sums: PoolCost, prior: float,
                  per: Literal["units", "requests"]) -> float:
        cfg = self.config
        count = sums.units if per == "units" else sums.requests
        return (cfg.prior_weight_s + sums.busy_s) / (cfg.prior_weight_s / prior + count)

    def seconds_per_unit(self, model: str, prior_per_s: float,
                         per: Literal["units", "requests"] = "units") -> float:
        """Replica-seconds one unit (or one request with optional work: a powerful pool's
        whole requests) costs on ``model``'s pools, the prior of ``prior_per_s`` weighing in."""
        prior = 1.0 / prior_per_s
        return self._capped(self._estimate(self._sums(model), prior, per), prior)

    def _capped(self, estimate: float, prior: float) -> float:
        """Within ``cap_ratio`` of the prior either way."""
        ratio = self.config.cap_ratio
        return min(max(estimate, prior / ratio), prior * ratio)

    def speeds(self, model: str, accelerators: list[str], prior_per_s: float,
               per: Literal["units", "requests"] = "units") -> dict[str, float]:
        """How much work a unit of each accelerator type does on ``model`` against the
        model's pooled cost (``seconds_per_unit``'s unit): 2.0 for a type that scores twice
        as fast as the average unit. An L4 and an H200 unit are not the same unit, and the
        allocator places lent units by what each buys.

        Each type's cost is estimated with the pooled one as its prior (a type with no
        evidence of its own is the average, 1.0), within ``cap_ratio`` of it. A type that
        holds all of the model's evidence is the pooled cost itself: exactly 1.0."""
        total = self._sums(model)
        pooled = self.seconds_per_unit(model, prior_per_s, per)
        out: dict[str, float] = {}
        for kind in accelerators:
            own = self._sums(model, kind)
            if own.busy_s <= 0.0 or own.busy_s >= total.busy_s:
                out[kind] = 1.0
                continue
            out[kind] = pooled / self._capped(self._estimate(own, pooled, per), pooled)
        return out

    def evidence_s(self, model: str) -> float:
        """Measured busy seconds behind the estimate (decayed): 0 means prior only."""
        return self._sums(model).busy_s

    @property
    def state(self) -> dict[str, PoolCost]:
        return dict(sorted(self.pools.items()))
