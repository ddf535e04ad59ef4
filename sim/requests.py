"""A request's path through the simulated fleet: decided by its region's client, sent to a
replica set by the load balancer (to baseline replicas when the powerful pool cannot serve it),
finished when its baseline and optional work are done or shed, then settled: the metrics, the
outcome record the client publishes, and its label, sent on its way after a delay.

``RequestPath`` is composed into ``sim.engine.Simulation``: the engine runs the clock and
calls it for each step's arrivals, outcomes and labels, for the requests a reclaim moves and
for a client's wait that runs out; the replica sets call it back when they finish or shed a
request's work. What it needs of the engine is given at construction: the regions, the
metrics, the message queue, the engine's delivery of the messages due before an arrival, and
its publishing.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Mapping

import numpy as np
from msgspec import UNSET

from schemas.contract import (
    ANSWER_VERSION,
    SUPPLY_VERSION,
    AnswerUse,
    Event,
    OutcomeLabel,
    RoutingOutcome,
)
from sim.attribution import Attribution, LabelQueue, PendingLabel, Truth, normal_from
from sim.clients import SurplusClient
from sim.fleet import RegionState, choose
from sim.messages import MessageQueue, PowerfulGivesUp
from sim.metrics import Metrics
from sim.scenario import Scenario
from sim.worker import BASE, OPT, WHOLE, NormalBlock, Request
from workers.client.config import powerful_wait_ms
from workers.client.decision import logged_propensity
from workers.policy.routing import Model
from workers.policy.shed_order import extras_gain


class RequestPath:
    """Arrivals, routing, completion and settlement of the requests of a run's regions."""

    def __init__(self, scenario: Scenario, regions: Mapping[str, RegionState], *,
                 metrics: Metrics, messages: MessageQueue, attribution: Attribution,
                 rng_labels: np.random.Generator, rng_outcomes: np.random.Generator,
                 deliver_until: Callable[[float], None],
                 publish: Callable[[int, str, str, Event], None]) -> None:
        """
        :param scenario: the run's scenario (its step, clients' wait, labels' fates).
        :param regions: every region of the run, by name, with its client and load balancer.
        :param metrics: where served, fallen-back and given-up requests are counted.
        :param messages: the queue a client's give-up (``PowerfulGivesUp``) is sent on.
        :param attribution: counts the truth of the labels the control plane joins.
        :param rng_labels: draws each label's fate (delay, lost, twice).
        :param rng_outcomes: draws the noise of each request's observed value.
        :param deliver_until: the engine's delivery of every message due before a time,
            called before each arrival so it meets the fleet as it is at its millisecond.
        :param publish: the engine's publishing, to the event log and the control plane.
        """
        self.sc = scenario
        self.step_ms = scenario.step_ms
        self.regions = regions
        self.metrics = metrics
        self._messages = messages
        self.attribution = attribution
        self.rng_labels = rng_labels
        self._outcome_noise = NormalBlock(rng_outcomes, 1.0)
        self._deliver_until = deliver_until
        self._publish = publish
        self._rid = itertools.count()
        #: rid -> (propensity, holdout) of its decision (sim.worker.Request does not keep them).
        #: Per request: its logged propensity, whether it is in the holdout, and what became
        #: of the precompute answer it held (None: none).
        self._logged: dict[int, tuple[float, bool, AnswerUse | None]] = {}
        #: Requests finished, by when (then by request id), not yet settled.
        self._finished: list[tuple[float, int, Request]] = []
        #: Labels on their way.
        self._labels = LabelQueue()

    # -- arrivals and routing -------------------------------------------------------------

    def arrivals(self, state: RegionState, k: int, t: int) -> None:
        """The requests arriving in ``state``'s region in step ``k`` (from ``t``), each at its
        own millisecond, decided by the client and sent to a replica set."""
        n = int(state.arrivals[k])
        if not n:
            return
        rng = state.rng
        offsets = np.sort(rng.integers(0, self.step_ms, n))
        segments = np.searchsorted(state.segment_cdf, rng.random(n), side="right")
        segments = np.minimum(segments, len(state.segment_names) - 1)
        values = np.clip(state.segment_values[segments] + state.segment_value_noise[segments]
                         * rng.standard_normal(n), 0.0, None)
        picks = rng.random(n)
        rc = state.config
        for offset, seg, value, pick in zip(offsets.tolist(), segments.tolist(),
                                            values.tolist(), picks.tolist(), strict=True):
            now = t + offset
            self._deliver_until(now + 1)
            rid = next(self._rid)
            request_id = f"{rc.name}-{rid}"
            # a fresh precompute answer: ranked ahead, over more candidates; send the base only
            worth, answer = ((None, None) if state.precompute is None else
                             state.precompute.visit(request_id, rc.segments[seg].gain, now))
            available = rc.max_extra_candidates if worth is None else 0
            decision = state.client.decide(state.segment_names[seg], value, available, now,
                                           request_id)
            self._logged[rid] = (decision.propensity, decision.holdout, answer)
            req = Request(rid, now, seg, value, rc.base_candidates, decision.extra,
                          decision.model, decision.explored, decision.gain, available=available,
                          precomputed=worth)
            if decision.model == "powerful":
                self._to_powerful(state, req, now, pick)
            else:
                self._to_ranking(state, req, now, pick)

    def _to_ranking(self, state: RegionState, req: Request, now: float, pick: float) -> None:
        worker = choose(state.ranking_pick, pick)
        if worker is None:  # never: the baseline tier always has replicas
            raise RuntimeError(f"region {state.config.name} has no ranking replica")
        if req.extra and not req.fell_back:   # sized to the replica, as the live client does
            kept = state.client.fit_to_replica(worker.worker_id, req.extra)
            if kept < req.extra:
                req.extra, req.gain = kept, extras_gain(kept)
        state.served_this_step.add(worker)
        worker.submit_ranking(req, int(now), state.config.deadline_ms)

    def _to_powerful(self, state: RegionState, req: Request, now: int, pick: float) -> None:
        worker = choose(state.powerful_pick, pick)
        if worker is None:
            state.client.observe(None, now, error="connection", model="powerful")
            self._fallback(state, req, now, "connection")
            return
        state.served_this_step.add(worker)
        wait = self._powerful_wait(state)
        if worker.submit_whole(req, now, wait):
            self._messages.send(req.arrival_ms + wait, PowerfulGivesUp(state.config.name, req))
        else:
            # The live worker answers a refused whole request with a 503, which the client
            # counts as a failed call of that pool.
            state.client.observe(None, now, error="http_503", model="powerful")
            self._fallback(state, req, now, worker.admission.last_refusal or "refused")

    def _fallback(self, state: RegionState, req: Request, now: float, reason: str) -> None:
        """The powerful pool did not serve it: baseline replicas do (only baseline work)."""
        req.fell_back = True
        req.model = "baseline"
        self.metrics.regions[state.config.name].fallbacks += 1
        if isinstance(state.client, SurplusClient):
            state.client.decider.bump("fallback", reason)
            state.client.decider.bump("rma_shed", "fallback", req.extra)
        self._to_ranking(state, req, now, float(state.rng.random()))

    def moved(self, state: RegionState, req: Request, now: int) -> None:
        """A reclaimed replica set leaves with ``req``'s baseline work queued: it moves to
        another ranking replica set (its optional work is gone)."""
        self.metrics.regions[state.config.name].moved += 1
        req.opt_pending = False
        self._to_ranking(state, req, now, float(state.rng.random()))

    def _powerful_wait(self, state: RegionState) -> float:
        """How long the client waits for the powerful model: its share of the deadline."""
        return powerful_wait_ms(state.config.deadline_ms, self.sc.client.powerful_deadline_share)

    def give_up(self, region: str, req: Request, now: int) -> None:
        """The client's wait for a powerful call is over (the live client's timeout): unless
        it was answered or refused already, the call counts as the pool's failure and the
        request falls back to the ranking pool with what is left of its deadline."""
        if req.powerful_done or req.fell_back:
            return
        state = self.regions[region]
        state.client.observe(None, now, error="timeout", model="powerful")
        self._fallback(state, req, now, "timeout")

    # -- the replica sets' answers ---------------------------------------------------------

    def done(self, req: Request, kind: int, latency: float) -> None:
        """A replica set finished ``req``'s work of ``kind`` after ``latency`` ms."""
        if kind == BASE:
            req.base_latency = latency
        elif kind == OPT:
            req.opt_latency = latency
            req.opt_done = True
            req.opt_pending = False
        else:
            self._powerful_answered(req, latency)
            return
        if req.base_latency is not None and not req.opt_pending:
            self._finish(req, req.at_worker_ms + max(req.base_latency, req.opt_latency))

    def _powerful_answered(self, req: Request, latency: float) -> None:
        """A powerful replica answers after ``latency``: within the client's wait the request
        is served. An answer past the wait, or to a request that fell back already (the wait
        ran out, or the client gave up before the replica began), is given up on: the replica,
        which cannot know, has done the work and reports it, and the request is settled with
        its fallback (at the end of the wait, ``give_up``, if it has not fallen back yet)."""
        powerful = req.powerful
        assert powerful is not None
        in_time = not req.fell_back and latency <= self._powerful_wait(
            self.regions[powerful.region])
        self.metrics.powerful_answered(powerful.region, latency, abandoned=not in_time)
        if in_time:
            req.opt_latency = latency
            req.powerful_done = True
            self._finish(req, req.arrival_ms + latency)
        else:
            powerful.abandoned(req, latency)

    def shed(self, req: Request, kind: int, reason: str, now: float) -> None:
        """A replica set dropped ``req``'s queued work of ``kind`` at ``now`` for ``reason``."""
        if kind == WHOLE:
            if req.fell_back:   # the client had given up on it already
                return
            assert req.powerful is not None
            state = self.regions[req.powerful.region]
            # the refusal reaches the client, unless its wait ran out first
            self._fallback(state, req, min(now, req.arrival_ms + self._powerful_wait(state)),
                           reason)
            return
        if kind == OPT:
            req.opt_pending = False
            req.opt_latency = max(req.opt_latency, now - req.at_worker_ms)
            if req.base_latency is not None:
                self._finish(req, req.at_worker_ms + max(req.base_latency, req.opt_latency))

    def _finish(self, req: Request, at_ms: float) -> None:
        req.finished_ms = at_ms
        heapq.heappush(self._finished, (at_ms, req.rid, req))

    # -- settlement ------------------------------------------------------------------------

    def outcomes(self, end: int) -> None:
        """Requests finished by ``end``: metrics, telemetry, learning, outcome events."""
        while self._finished and self._finished[0][0] <= end:
            _, _, req = heapq.heappop(self._finished)
            assert req.worker is not None
            state = self.regions[req.worker.region]
            self._settle(state, req, end)

    def _settle(self, state: RegionState, req: Request, end: int) -> None:
        rc = state.config
        seg = rc.segments[req.segment]
        worker = req.worker
        assert worker is not None
        e2e = req.finished_ms - req.arrival_ms
        worker.answered(req)
        if req.powerful_done:
            done = req.opt_units          # the extras the powerful replica kept
            units = req.base + done
            rma = rc.rma_value(done)
            self.metrics.powerful_done(rc.name, e2e, units, seg.gain, rma)
            model: Model = "powerful"
        else:
            latency = req.finished_ms - req.at_worker_ms
            done = req.opt_units if req.opt_done else 0
            rma = rc.rma_value(done)
            self.metrics.ranking_done(rc.name, latency, e2e, rc.timeout_ms, done, rma)
            model = "baseline"
        sbm = seg.gain if model == "powerful" else 0.0
        pre = 0.0 if req.precomputed is None else max(0.0, req.precomputed - rma - sbm)
        if pre:
            self.metrics.precompute_used(rc.name, pre)
        observed = seg.value + sbm + rma + pre \
            + seg.outcome_noise * (math.log(self._outcome_noise()))
        observed = max(-1e6, min(1e6, observed))
        chosen_p, holdout, answer = self._logged.pop(req.rid, (1.0, False, None))
        chosen: Model = "powerful" if req.fell_back else model
        propensity = logged_propensity(chosen, chosen_p, model)   # as the live client logs it
        truth = None if holdout else Truth(model == "powerful", sbm + rma + pre,
                                           1.0 / propensity, answer)
        request_id = f"{rc.name}-{req.rid}"
        self._publish(end, "outcomes", rc.name, RoutingOutcome(
            v=SUPPLY_VERSION if answer is None else ANSWER_VERSION,   # as the live client
            ts_ms=int(req.finished_ms), scope=rc.name,
            request_id=request_id, segment=seg.name, model=model,
            explored=req.explored and not req.fell_back,
            extra=done if not req.fell_back else 0,   # as the live client logs: scored
            propensity=propensity, holdout=holdout, available=req.available,
            answer=UNSET if answer is None else answer))
        draws = self.rng_labels.random(4)
        fate = self.sc.labels.fate(float(draws[0]), float(normal_from(draws[1], draws[2])),
                                   float(draws[3]), unit=1000.0)
        if fate is None:
            return
        delay_ms, twice = fate
        due = req.finished_ms + delay_ms
        label = PendingLabel(rc.name, request_id, observed, seg.name, model, end, truth)
        self._labels.send(due, label)
        if twice:
            self._labels.send(due + delay_ms, PendingLabel(
                rc.name, request_id, observed, seg.name, model, end, None))

    def deliver_labels(self, end: int) -> None:
        """Labels due by ``end``: to the client (its router's evidence) and the control plane."""
        window_ms = self.sc.control.labels.window_s * 1000.0
        for due, label in self._labels.due_by(end):
            if end - label.decided_ms <= window_ms:   # it joins: count its truth
                self.attribution.joined(label)
            self.regions[label.region].client.learn(label.segment, label.model, label.value)
            self._publish(end, "labels", label.request_id, OutcomeLabel(
                ts_ms=int(due), scope=label.region, request_id=label.request_id,
                value=label.value))

