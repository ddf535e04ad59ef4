"""A request's path through the simulated fleet (``sim.requests.RequestPath``), built whole
from its dependencies: one region with a ranking and a powerful replica set, a client that
routes as told, and the messages and events it sends collected here."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import numpy as np
import pytest

from schemas.contract import (
    ControlTargets,
    Event,
    OutcomeLabel,
    RmaTarget,
    RoutingOutcome,
    SbmTarget,
)
from sim.attribution import Attribution
from sim.fleet import OppPool, RegionState
from sim.messages import MessageQueue, PowerfulGivesUp
from sim.metrics import Metrics
from sim.requests import RequestPath
from sim.scenario import Scenario
from sim.worker import WHOLE, Request, SimWorker
from tests.unit.sim.helpers import POWERFUL, lent_scenario
from workers.api import ServerState
from workers.client.decision import Decision
from workers.policy.routing import Model

#: The client waits 60 ms (its default share of the 100 ms deadline) for the powerful model.
WAIT_MS = 60.0


class Client:
    """A region's client that sends every request to ``model`` and keeps what it is told."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.errors: list[tuple[str, str]] = []

    def decide(self, segment: str, value: float, available_extra: int, now: int,
               request_id: str | None = None) -> Decision:
        return Decision(self.model, False, 0, "fresh", propensity=0.5, gain=0.1)

    def offer(self, targets: ControlTargets, now: int) -> None:
        return None

    def observe(self, state: ServerState | None, now: int, error: str | None = None,
                model: Model = "baseline", replica: str | None = None) -> None:
        if error is not None:
            self.errors.append((model, error))

    def fit_to_replica(self, replica: str, extra: int) -> int:
        return extra

    def learn(self, segment: str, model: str, value: float) -> None:
        return None

    def counters(self) -> dict[str, dict[str, int]]:
        return {}


class Fleet:
    """One region (``eu1``), its request path, and what it publishes and sends."""

    def __init__(self, scenario: Scenario, model: Model, *, powerful: bool = True) -> None:
        rc = scenario.regions[0]
        self.client = Client(model)
        self.state = RegionState(
            config=rc, client=self.client, arrivals=np.ones(10, dtype=np.int64),
            rng=np.random.default_rng(1), segment_names=["all"], segment_cdf=np.ones(1),
            segment_values=np.array([0.5]), segment_value_noise=np.zeros(1),
            has_powerful=powerful)
        self.metrics = Metrics({"eu1": 50.0}, io.StringIO(), 0, deadlines={"eu1": 100.0})
        self.messages = MessageQueue()
        self.published: list[tuple[str, Event]] = []
        rngs = np.random.default_rng(7).spawn(2)
        self.path = RequestPath(
            scenario, {"eu1": self.state}, metrics=self.metrics, messages=self.messages,
            attribution=Attribution(0), rng_labels=rngs[0], rng_outcomes=rngs[1],
            deliver_until=self.deliver_until,
            publish=lambda ts, topic, key, value: self.published.append((topic, value)))
        ids = itertools.count()
        for pool in rc.pools:
            worker = SimWorker(pool, "eu1", f"eu1-{next(ids)}", 1,
                               admission=scenario.worker.admission,
                               limits=scenario.worker.limits, start_ms=0, noise=lambda: 1.0,
                               on_done=self.path.done, on_shed=self.path.shed)
            worker.offer_targets(ControlTargets(
                scope="eu1", epoch=1, issued_at_ms=0, ttl_ms=60_000,
                rma=RmaTarget(extra_candidates=0, budget_units_per_s=0.0),
                sbm=SbmTarget(coverage=1.0)), 0)
            if pool.tier == "baseline":
                self.state.baseline_workers.append(worker)
            elif powerful:
                opp = OppPool(pool, pool.pool_id("eu1"), lent=1, live=[worker])
                self.state.opportunistic.append(opp)
        self.state.repick()

    @property
    def ranking(self) -> SimWorker:
        return self.state.baseline_workers[0]

    @property
    def powerful(self) -> SimWorker:
        return self.state.opportunistic[0].live[0]

    def deliver_until(self, until: float) -> None:
        """What the engine does with the messages the path sends: a client's wait runs out."""
        for at, message in self.messages.due_before(until):
            assert isinstance(message, PowerfulGivesUp)
            self.path.give_up(message.region, message.request, int(at))

    def run_to(self, end: int) -> None:
        """A step's end, in the engine's order: messages, replica sets, settlement."""
        self.deliver_until(end)
        for worker in self.state.workers():
            worker.advance(end)
        self.path.outcomes(end)

    def outcomes(self) -> list[RoutingOutcome]:
        return [v for topic, v in self.published if isinstance(v, RoutingOutcome)]


def _fleet(tmp_path: Path, ms: float, model: Model = "powerful", **kw: bool) -> Fleet:
    scenario, _ = lent_scenario(tmp_path, POWERFUL.format(ms=ms))
    return Fleet(scenario, model, **kw)


def test_an_answer_within_the_wait_is_served_and_published_as_the_powerful_models(
        tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, 40.0)
    fleet.path.arrivals(fleet.state, 0, 0)
    fleet.run_to(200)
    region = fleet.metrics.regions["eu1"]
    assert (region.powerful_served, region.fallbacks, region.abandoned) == (1, 0, 0)
    [outcome] = fleet.outcomes()
    assert (outcome.model, outcome.propensity) == ("powerful", 0.5)
    assert fleet.client.errors == []


def test_an_answer_past_the_wait_falls_back_at_its_end_and_is_still_reported(
        tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, 80.0)
    fleet.path.arrivals(fleet.state, 0, 0)
    fleet.run_to(300)
    region = fleet.metrics.regions["eu1"]
    assert (region.powerful_served, region.fallbacks, region.abandoned) == (0, 1, 1)
    assert region.window.powerful_latency == [80.0]
    assert fleet.client.errors == [("powerful", "timeout")]
    [outcome] = fleet.outcomes()   # the arm that served it, with the chance of not choosing it
    assert (outcome.model, outcome.extra, outcome.propensity) == ("baseline", 0, 0.5)
    report = fleet.powerful.report(300)
    assert (report.requests, report.latency_ms.count) == (1, 1)


@pytest.mark.parametrize("wait_runs_out_first", [False, True])
def test_a_late_answer_is_one_rule_whether_the_client_gave_up_before_or_after_it(
        tmp_path: Path, wait_runs_out_first: bool) -> None:
    """The replica may compute its answer after the engine has delivered the client's
    give-up (it is run lazily): the answer is recorded the same either way."""
    fleet = _fleet(tmp_path, 80.0)
    req = Request(0, 0, 0, 0.5, 50, 0, "powerful", gain=0.1, opt_units=7,
                  worker=fleet.powerful, powerful=fleet.powerful)
    if wait_runs_out_first:
        fleet.path.give_up("eu1", req, int(WAIT_MS))
    fleet.path.done(req, WHOLE, 80.0)
    if not wait_runs_out_first:
        fleet.path.give_up("eu1", req, int(WAIT_MS))
    fleet.run_to(300)
    region = fleet.metrics.regions["eu1"]
    assert (region.powerful_served, region.fallbacks, region.abandoned) == (0, 1, 1)
    assert req.fell_back and not req.powerful_done and req.worker is fleet.ranking
    report = fleet.powerful.report(300)   # the replica reports the rows it kept and scored
    assert (report.requests, report.optional_units_done) == (1, 57)
    assert report.latency_ms.count == 1


def test_an_answer_after_the_fallback_is_given_up_on_even_within_the_wait(
        tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, 40.0)
    req = Request(0, 0, 0, 0.5, 50, 0, "powerful", gain=0.1, worker=fleet.powerful,
                  powerful=fleet.powerful)
    fleet.path.shed(req, WHOLE, "overload", 10.0)   # the replica dropped it from its queue
    fleet.path.done(req, WHOLE, 30.0)
    region = fleet.metrics.regions["eu1"]
    assert (region.powerful_served, region.fallbacks, region.abandoned) == (0, 1, 1)


def test_without_a_powerful_replica_the_client_counts_a_failed_call_and_falls_back(
        tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, 40.0, powerful=False)
    fleet.path.arrivals(fleet.state, 0, 0)
    fleet.run_to(200)
    assert fleet.client.errors == [("powerful", "connection")]
    region = fleet.metrics.regions["eu1"]
    assert (region.ranking_served, region.fallbacks, region.abandoned) == (1, 1, 0)


def test_a_ranking_request_is_served_and_its_decision_recorded(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, 40.0, model="baseline")
    fleet.path.arrivals(fleet.state, 0, 0)
    fleet.run_to(200)
    [outcome] = fleet.outcomes()
    assert (outcome.model, outcome.scope, outcome.request_id) == ("baseline", "eu1", "eu1-0")
    assert fleet.metrics.regions["eu1"].ranking_served == 1


def test_requests_moved_by_a_reclaim_are_counted_and_served_elsewhere(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, 40.0, model="baseline")
    req = Request(0, 0, 0, 0.5, 50, 0)
    fleet.path.moved(fleet.state, req, 5)
    fleet.run_to(200)
    region = fleet.metrics.regions["eu1"]
    assert (region.moved, region.ranking_served) == (1, 1)
    assert req.worker is fleet.ranking and req.at_worker_ms == 5


def test_labels_reach_the_control_plane_after_their_delay(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path, 40.0, model="baseline")
    for k in range(10):
        fleet.path.arrivals(fleet.state, k, k * 100)
        fleet.run_to((k + 1) * 100)
    fleet.path.deliver_labels(10_000_000)
    labels = [v for _, v in fleet.published if isinstance(v, OutcomeLabel)]
    assert labels and {label.request_id for label in labels} <= {
        o.request_id for o in fleet.outcomes()}
