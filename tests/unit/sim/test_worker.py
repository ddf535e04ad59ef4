"""The simulated worker composes the real policies the way the live worker does."""

from __future__ import annotations

import itertools
import math

import pytest

from schemas.contract import ControlTargets, PreemptionNotice, RmaTarget, SbmTarget
from sim.scenario import CapacityConfig, PoolConfig
from sim.worker import BASE, OPT, FluidServer, LatencyCurve, Request, SimWorker
from workers.policy.admission import AdmissionConfig
from workers.policy.targets import LocalLimits

POOL = PoolConfig(model="baseline", tier="opportunistic", accelerator="l4", units_per_s=1000.0,
                  latency_curve=((0.0, 20.0), (1.0, 120.0)), latency_sigma=0.0,
                  capacity=CapacityConfig())


def _worker(done: list, shed: list, admission: AdmissionConfig | None = None) -> SimWorker:
    return SimWorker(POOL, "eu1", "eu1-w0", 2, admission=admission or AdmissionConfig(),
                     limits=LocalLimits(),
                     start_ms=0, noise=lambda: 1.0,
                     on_done=lambda r, k, lat: done.append((r.rid, k, lat)),
                     on_shed=lambda r, k, why, now: shed.append((r.rid, k, why, now)))


def _targets(extra: int, epoch: int = 1, at: int = 0) -> ControlTargets:
    return ControlTargets(scope="eu1", epoch=epoch, issued_at_ms=at, ttl_ms=60_000,
                          rma=RmaTarget(extra_candidates=extra, budget_units_per_s=1e6),
                          sbm=SbmTarget(coverage=0.0))


_ids = itertools.count()


def _request(now: int, base: int = 10, extra: int = 10) -> Request:
    return Request(next(_ids), now, 0, 0.5, base, extra)


def test_the_fluid_server_drains_work_at_the_replicas_rate_and_then_has_room() -> None:
    server = FluidServer(units_per_s=1000.0, inflight_ms=10.0, replicas=2, start_ms=0)
    assert (server.rate_per_ms, server.room, server.free_at()) == (2.0, 20.0, 0.0)
    assert server.take(60) == 30.0        # 60 units at 2 a ms
    assert server.free_at() == 20.0       # room again once 40 have drained
    server.drain_to(20.0)
    assert (server.in_service, server.free_at(), server.busy_ms) == (20.0, 20.0, 30.0)
    busy = server.utilisation()
    server.drain_to(1_020.0)              # idle for the utilisation's time constant
    assert server.in_service == 0.0 and server.utilisation() == pytest.approx(busy / math.e)


def test_latency_curve_interpolates_and_is_flat_past_its_ends() -> None:
    curve = LatencyCurve(((0.2, 10.0), (0.6, 30.0)))
    assert (curve(0.0), curve(0.4), curve(0.9)) == (10.0, 20.0, 30.0)


def test_without_targets_only_baseline_work_runs_and_the_rest_is_counted() -> None:
    done: list = []
    worker = _worker(done, [])
    req = _request(0)
    worker.submit_ranking(req, 0, 100.0)
    assert [k for _, k, _ in done] == [BASE]
    assert worker.admission.shed_units == {"stale_targets": 10}


def test_targets_allow_extra_candidates_up_to_the_target() -> None:
    done: list = []
    worker = _worker(done, [])
    worker.offer_targets(_targets(extra=4), 0)
    worker.submit_ranking(_request(1, extra=10), 1, 100.0)
    assert sorted(k for _, k, _ in done) == [BASE, OPT]
    assert worker.admission.shed_units == {"over_target": 6}


def test_below_saturation_latency_is_the_curve_and_nothing_waits() -> None:
    done: list = []
    worker = _worker(done, [])
    worker.submit_ranking(_request(0, base=10, extra=0), 0, 100.0)
    assert done[0][1] == BASE and 20.0 <= done[0][2] < 20.6   # utilisation ~0.005


def test_past_saturation_baseline_queues_first_and_optional_is_shed() -> None:
    done: list = []
    shed: list = []
    worker = _worker(done, shed)
    worker.offer_targets(_targets(extra=1000), 0)
    for _ in range(20):   # 20 x 1010 units into 2 units/ms: far past saturation
        worker.submit_ranking(_request(0, base=10, extra=1000), 0, 1000.0)
    worker.advance(10_000)
    base_done = [lat for _, k, lat in done if k == BASE]
    assert len(base_done) == 20                      # baseline is never refused
    assert worker.admission.shed_units.get("overload", 0) > 0
    assert max(base_done) > 20.0                     # and some of it waited


def test_a_notice_stops_optional_work_at_once_and_keeps_baseline() -> None:
    done: list = []
    shed: list = []
    worker = _worker(done, shed, AdmissionConfig(max_queue_delay_ms=60_000.0))
    worker.offer_targets(_targets(extra=1000), 0)
    for _ in range(5):
        worker.submit_ranking(_request(0, base=10, extra=1000), 0, 10_000.0)
    notice = PreemptionNotice(notice_id="n", ts_ms=3, region="eu1", pool_id=POOL.pool_id("eu1"),
                              deadline_ms=1000)
    assert worker.concerns(notice)
    assert worker.preempt(notice, 5) == "applied"
    assert worker.stopped_optional_ms == 5.0 and not worker.ready
    assert shed and all(why == "preemption" and now == 5 for _, _, why, now in shed)
    worker.submit_ranking(_request(6, base=10, extra=10), 6, 100.0)
    assert worker.admission.shed_units["preemption"] >= 10
    handed_back = worker.evict(1000)
    assert worker.replicas == 0
    assert all(isinstance(r, Request) for r in handed_back)


def test_a_request_gets_the_extras_that_fit_under_the_delay_bound_not_none() -> None:
    done: list = []
    worker = _worker(done, [])                         # 2 units/ms, 25 ms bound
    worker.offer_targets(_targets(extra=200), 0)
    req = _request(0, base=10, extra=200)
    worker.submit_ranking(req, 0, 1000.0)
    assert req.opt_units == 40                         # 25 ms less the 5 ms of its baseline
    assert worker.admission.shed_units == {"overload": 160}


def test_a_fallback_from_the_past_is_not_charged_the_engines_order_as_a_wait() -> None:
    """The engine may run this replica to the end of a step before a powerful replica finds a
    request past its deadline earlier in that step; the fallback then reaches this replica at
    its own clock, and waits in its queue only for what is queued there."""
    done: list = []
    worker = _worker(done, [])
    worker.advance(1_000)
    late = _request(900, extra=0)
    worker.submit_ranking(late, 900, 100.0)
    assert late.at_worker_ms == 1_000
    assert done[0][1] == BASE and 20.0 <= done[0][2] < 20.6   # the curve, no 100 ms wait


def test_overload_sheds_the_requests_that_gain_least_not_those_worth_least() -> None:
    """The powerful replica past saturation: requests of a segment that gains much keep
    their place even when worth little; those worth much that gain little give way."""
    done: list = []
    refused: list = []
    worker = SimWorker(PoolConfig(model="powerful", tier="opportunistic", accelerator="l4",
                                  units_per_s=1000.0, latency_curve=((0.0, 20.0), (1.0, 120.0)),
                                  latency_sigma=0.0, capacity=CapacityConfig()),
                       "eu1", "eu1-p0", 1, admission=AdmissionConfig(), limits=LocalLimits(),
                       start_ms=0, noise=lambda: 1.0,
                       on_done=lambda r, k, lat: done.append(r.rid),
                       on_shed=lambda r, k, why, now: refused.append(r.rid))
    worker.offer_targets(_targets(extra=0), 0)
    rich = [Request(next(_ids), 0, 0, 0.9, 200, 0, "powerful", gain=0.01) for _ in range(6)]
    poor = [Request(next(_ids), 0, 0, 0.1, 200, 0, "powerful", gain=0.3) for _ in range(4)]
    for req in rich + poor:   # 200 ms of work each, 1 s to finish in: five fit
        if not worker.submit_whole(req, 0, 1000.0):
            refused.append(req.rid)
    worker.advance(10_000)
    assert {r.rid for r in poor} <= set(done)
    assert {r.rid for r in rich} & set(refused)
