"""The simulated fleet's load balancer (``sim.fleet``): replica sets picked in proportion to
their throughput, draining ones out of the tables, and the RMA budget shared by throughput."""

from __future__ import annotations

import numpy as np

from sim.fleet import OppPool, RegionState, choose, cumulative
from sim.scenario import CapacityConfig, PoolConfig, RegionConfig, SegmentConfig
from sim.worker import SimWorker
from workers.policy.admission import AdmissionConfig
from workers.policy.targets import LocalLimits

BASELINE = PoolConfig(replicas=1, units_per_s=1000.0)
LENT = PoolConfig(tier="opportunistic", accelerator="cpu", units_per_s=1000.0,
                  capacity=CapacityConfig())
POWERFUL = PoolConfig(model="powerful", tier="opportunistic", accelerator="a100",
                      units_per_s=1000.0, capacity=CapacityConfig())


def _worker(pool: PoolConfig, name: str, replicas: int) -> SimWorker:
    return SimWorker(pool, "eu1", name, replicas, admission=AdmissionConfig(),
                     limits=LocalLimits(), start_ms=0, noise=lambda: 1.0,
                     on_done=lambda *_: None, on_shed=lambda *_: None)


def _region() -> RegionState:
    config = RegionConfig(name="eu1", segments=[SegmentConfig(name="all", share=1.0)],
                          pools=[BASELINE, LENT, POWERFUL])
    return RegionState(config=config, client=None,  # type: ignore[arg-type]
                       arrivals=np.zeros(1), rng=np.random.default_rng(0),
                       segment_names=["all"], segment_cdf=np.ones(1),
                       segment_values=np.ones(1), segment_value_noise=np.zeros(1))


def test_a_replica_set_is_picked_in_proportion_to_its_throughput() -> None:
    small, big = _worker(BASELINE, "a", 1), _worker(BASELINE, "b", 3)
    pick = cumulative([small, big])
    assert pick[0] == [0.25, 1.0]
    assert choose(pick, 0.2) is small and choose(pick, 0.25) is big and choose(pick, 0.99) is big
    assert choose(pick, 1.0) is big   # a draw at the top end still picks the last set


def test_no_replica_set_no_pick() -> None:
    assert choose(cumulative([]), 0.5) is None
    assert cumulative([_worker(BASELINE, "a", 0)]) == ([], [])


def test_repick_routes_to_ready_sets_and_shares_the_budget_by_throughput() -> None:
    state = _region()
    base = _worker(BASELINE, "eu1-base", 1)
    lent, leaving = _worker(LENT, "eu1-lent-0", 3), _worker(LENT, "eu1-lent-3", 1)
    powerful = _worker(POWERFUL, "eu1-pow-0", 1)
    leaving.draining_deadline_ms = 5_000
    state.baseline_workers.append(base)
    state.opportunistic += [OppPool(LENT, "lent", lent=4, live=[lent, leaving]),
                            OppPool(POWERFUL, "pow", lent=1, live=[powerful])]
    state.repick()
    assert state.ranking_pick[1] == [base, lent]
    assert state.powerful_pick[1] == [powerful]
    assert (base.budget_share, lent.budget_share) == (0.25, 0.75)
    assert state.ranking_workers() == [base, lent, leaving]


def test_workers_lists_every_set_once_by_id_draining_included() -> None:
    state = _region()
    state.baseline_workers.append(_worker(BASELINE, "b", 1))
    state.opportunistic.append(OppPool(LENT, "lent", lent=1, live=[_worker(LENT, "c", 1)]))
    state.draining.append(_worker(LENT, "a", 1))
    assert [w.worker_id for w in state.workers()] == ["a", "b", "c"]
