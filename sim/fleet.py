"""The simulated fleet as the engine keeps it: per region, its client, its arrivals, its
replica sets (baseline, lent by the opportunistic pools, draining) and the load balancer's
tables over them."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

from sim.clients import SimClient
from sim.precompute import RegionPrecompute
from sim.scenario import PoolConfig, RegionConfig
from sim.worker import SimWorker

#: A load balancer's table: cumulative shares of throughput, and the replica sets.
Pick = tuple[list[float], list[SimWorker]]


@dataclass
class OppPool:
    """One opportunistic pool as the fleet has it: replicas lent, and the replica sets that
    serve them (replicas 0.. ``lent`` - 1, oldest set first; a set is named by its first
    replica's id)."""

    config: PoolConfig
    pool_id: str
    lent: int = 0
    live: list[SimWorker] = field(default_factory=list)


@dataclass
class RegionState:
    config: RegionConfig
    client: SimClient
    arrivals: np.ndarray
    rng: np.random.Generator
    segment_names: list[str]
    segment_cdf: np.ndarray
    segment_values: np.ndarray
    segment_value_noise: np.ndarray
    baseline_workers: list[SimWorker] = field(default_factory=list)
    opportunistic: list[OppPool] = field(default_factory=list)
    draining: list[SimWorker] = field(default_factory=list)
    ranking_pick: Pick = ([], [])
    powerful_pick: Pick = ([], [])
    served_this_step: set[SimWorker] = field(default_factory=set)
    has_powerful: bool = False
    precompute: RegionPrecompute | None = None

    def workers(self) -> list[SimWorker]:
        live = [w for pool in self.opportunistic for w in pool.live]
        return sorted(self.baseline_workers + live + self.draining, key=lambda w: w.worker_id)

    def ranking_workers(self) -> list[SimWorker]:
        opp = [w for pool in self.opportunistic for w in pool.live
               if pool.config.model == "baseline"]
        return self.baseline_workers + opp

    def repick(self) -> None:
        """Load-balancer tables: ready replica sets weighted by their throughput."""
        ranking = [w for w in self.ranking_workers() if w.ready]
        powerful = [w for pool in self.opportunistic for w in pool.live
                    if pool.config.model == "powerful" and w.ready]
        self.ranking_pick = cumulative(ranking)
        self.powerful_pick = cumulative(powerful)
        total = sum(w.rate_per_ms for w in ranking)
        for w in ranking:
            w.budget_share = w.rate_per_ms / total if total else 0.0


def cumulative(workers: list[SimWorker]) -> Pick:
    """Cumulative throughput shares and the workers, for a draw weighted by throughput (what
    a load balancer's weights do); empty when nothing can serve."""
    total = sum(w.rate_per_ms for w in workers)
    if total <= 0:
        return [], []
    running, bounds = 0.0, []
    for w in workers:
        running += w.rate_per_ms / total
        bounds.append(running)
    bounds[-1] = 1.0
    return bounds, workers


def choose(pick: Pick, u: float) -> SimWorker | None:
    """The replica set a uniform draw ``u`` picks, weighted by throughput; None if none."""
    bounds, workers = pick
    if not workers:
        return None
    return workers[min(bisect_right(bounds, u), len(workers) - 1)]
