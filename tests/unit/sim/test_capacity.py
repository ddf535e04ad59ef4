"""The fleet's capacity as the schedule changes it (``sim.capacity.Capacity``): baseline
replica sets from the start, a grant's replica set with the targets in force, a notice that
drains the newest replicas until its deadline, revokes at the end, and the lent time counted.
The schedule is helpers' ``LENT``: 3 replicas at 5 s, a notice at 30 s for 2 of them (2 s
ahead), a storm at 40 s (1 s notice) and the pool back 10 s later."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from schemas.contract import (
    CapacityEvent,
    ControlTargets,
    Event,
    PreemptionNotice,
    RmaTarget,
    SbmTarget,
)
from sim.attribution import Attribution
from sim.capacity import Capacity
from sim.clients import NaiveClient
from sim.fleet import OppPool, RegionState
from sim.messages import CapacityDue, MessageQueue, NoticeArrives, ReplicasLeave
from sim.metrics import Metrics
from sim.requests import RequestPath
from tests.unit.sim.helpers import lent_scenario


class Run:
    """``Capacity`` over one region, driven step by step as the engine drives it."""

    def __init__(self, tmp_path: Path) -> None:
        scenario, base = lent_scenario(tmp_path)
        self.t0, self.step_ms = scenario.start_ms, scenario.step_ms
        self.targets = ControlTargets(
            scope="eu1", epoch=1, issued_at_ms=self.t0, ttl_ms=600_000,
            rma=RmaTarget(extra_candidates=10, budget_units_per_s=1e6),
            sbm=SbmTarget(coverage=0.0))
        rc = scenario.regions[0]
        self.state = RegionState(
            config=rc, client=NaiveClient("eu1", scenario.client, scenario.controllers.naive),
            arrivals=np.zeros(1), rng=np.random.default_rng(0), segment_names=["all"],
            segment_cdf=np.ones(1), segment_values=np.ones(1), segment_value_noise=np.zeros(1))
        self.state.opportunistic = [OppPool(p, p.pool_id("eu1")) for p in rc.pools
                                    if p.tier == "opportunistic"]
        self.metrics = Metrics({"eu1": 50.0}, io.StringIO(), self.t0)
        self.messages = MessageQueue()
        self.published: list[tuple[int, str, Event]] = []
        rngs = np.random.default_rng(3).spawn(4)
        requests = RequestPath(
            scenario, {"eu1": self.state}, metrics=self.metrics, messages=self.messages,
            attribution=Attribution(self.t0), rng_labels=rngs[0], rng_outcomes=rngs[1],
            deliver_until=lambda until: None, publish=self.publish)
        self.capacity = Capacity(
            scenario, base, {"eu1": self.state}, metrics=self.metrics, messages=self.messages,
            requests=requests, rng_latency=rngs[2], rng_delays=rngs[3],
            targets_in_force=lambda region: self.targets, publish=self.publish)
        self.k = 0

    def publish(self, ts: int, topic: str, key: str, value: Event) -> None:
        self.published.append((ts - self.t0, topic, value))

    def until(self, s: float) -> None:
        """Run the steps before ``s`` seconds."""
        while self.k * self.step_ms < s * 1000:
            t = self.t0 + self.k * self.step_ms
            self.capacity.step(self.k, t)
            for at, message in self.messages.due_before(t + self.step_ms):
                match message:
                    case CapacityDue(action):
                        self.capacity.due(action, int(at))
                    case NoticeArrives(notice):
                        for worker in self.state.workers():
                            worker.preempt(notice, int(at))
                    case ReplicasLeave(region, worker):
                        self.capacity.leave(region, worker, int(at))
            self.capacity.account(t, t + self.step_ms)
            self.k += 1

    @property
    def pool(self) -> OppPool:
        return self.state.opportunistic[0]


def test_the_baseline_replica_sets_are_there_from_the_start(tmp_path: Path) -> None:
    run = Run(tmp_path)
    [base] = run.state.baseline_workers
    assert base.replicas == 1 and run.state.ranking_pick[1] == [base]
    assert run.capacity.created["eu1"] == [base]


def test_a_grant_lends_a_replica_set_with_the_targets_in_force(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.until(5.1)
    [lent] = run.pool.live
    assert (run.pool.lent, lent.replicas) == (3, 3)
    assert not lent.targets.current(run.t0 + 5_100).baseline_only   # it may do optional work
    assert lent in run.state.ranking_pick[1]
    assert [(ts, topic) for ts, topic, _ in run.published] == [(5_000, "capacity")]


def test_lent_replicas_are_counted_offered_from_their_grant(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.until(10.0)
    assert run.metrics.opportunistic_available_s == pytest.approx(15.0)   # 3 for 5 s
    assert run.metrics.opportunistic_used_s == 0.0          # no request came


def test_a_notice_drains_the_newest_replicas_until_its_deadline(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.until(30.1)
    [kept] = run.pool.live
    [leaving] = run.state.draining
    assert (run.pool.lent, kept.replicas, leaving.replicas) == (1, 1, 2)
    assert leaving.draining_deadline_ms == run.t0 + 32_000 and not leaving.ready
    assert leaving not in run.state.ranking_pick[1]
    notices = [v for _, topic, v in run.published if topic == "preemption"]
    assert len(notices) == 1 and isinstance(notices[0], PreemptionNotice)
    run.until(32.1)
    assert run.state.draining == [] and leaving.replicas == 0


def test_the_end_revokes_what_is_still_lent(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.until(10.0)
    run.capacity.close(run.t0 + 10_000)
    ts, topic, revoke = run.published[-1]
    assert isinstance(revoke, CapacityEvent)
    assert (ts, topic, revoke.kind) == (10_000, "capacity", "revoke")
