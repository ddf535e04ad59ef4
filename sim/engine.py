"""The closed loop: traffic, clients, workers, a capacity scheduler and a control plane.

Time advances in steps of ``step_ms``; inside a step everything happens at its own
millisecond (requests arrive, targets and notices are delivered, replica sets serve batches),
so a 100 ms step does not blur a 5 ms reaction. At each step boundary the workers publish
their telemetry (every ``report_interval_s``), the capacity schedule's grants, renewals and
notices are published (``sim.schedule``, the one the live scheduler sends; a revoke at a
notice's deadline within a step goes out at its own millisecond, and the run ends with the
closing revokes), and the control plane ticks (every ``period_s``). The replicas a notice
names leave at its deadline; the notice reaches them after a random delay (the plant).

Everything the fleet publishes goes to the event log *and* to the control plane, in one order,
with non-decreasing timestamps: the log is exactly what the control plane saw, so
``surplus replay LOG --offline`` over it re-runs the same decisions. Clients publish routing
decision records in one batch per step (stamped at the step's end; each keeps its own time).
A request's outcome label (its value, with the RMA value of the extras it got and the
powerful model's gain, plus noise) reaches the control plane and the client after a
log-normal delay (``[labels]``: some never, some twice), published at the end of the step it
falls in; the control plane joins it with the decision (``streams.control.labels``). The
summary holds the control plane's measured lift next to the true one, which the simulator
knows (``lift``), and the join's counts (``labels``).

Randomness comes from one seed split into independent streams (arrivals, request
attributes, latency noise, outcome noise, message delays; the capacity schedule's reclaims
are child ``sim.schedule.CAPACITY_STREAM``), and arrival counts are drawn before the run:
every controller compared on a scenario gets the same number of requests in each step. Their
attributes (segment, value, replica pick) come from the region's stream, which the pick of a
fallback or of a request moved at a reclaim also draws from, so two controllers' requests are
the same only until their fallbacks or moves differ (in ``tests/unit/sim/test_engine.py``'s
scenario, static and surplus fell back 16 and 6 times and 650 of 2,095 requests' segments
differed, from request 403).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from schemas.contract import (
    ControlTargets,
    Event,
    PreemptionNotice,
)
from sim.attribution import Attribution
from sim.capacity import Capacity
from sim.clients import NaiveClient, SimClient, SurplusClient
from sim.controllers import ALIASES, ControlPlane, SurplusPlane, make_plane
from sim.fleet import OppPool, RegionState
from sim.messages import (
    CapacityDue,
    MessageQueue,
    NoticeArrives,
    PowerfulGivesUp,
    ReplicasLeave,
    TargetsArrive,
)
from sim.metrics import Metrics
from sim.overload import excused, overload_shares
from sim.precompute import RegionPrecompute
from sim.requests import RequestPath
from sim.scenario import RegionConfig, Scenario
from sim.schedule import CAPACITY_STREAM
from sim.traces import arrival_counts
from streams.eventlog import EventLogWriter, make_event
from streams.replay_output import Progress


class Simulation:
    """One run of a scenario under one controller; ``run`` writes the log and returns the
    summary. The engine keeps the clock, the messages and the publishing; ``run`` builds the
    regions, the requests' path through them (``sim.requests.RequestPath``) and their
    capacity (``sim.capacity.Capacity``), which the engine drives."""

    def __init__(self, scenario: Scenario, base_dir: Path, controller: str, out_dir: Path, *,
                 progress: bool = False, log_name: str = "events.jsonl.zst") -> None:
        self.sc = scenario
        self.base_dir = base_dir
        self.controller = ALIASES.get(controller, controller)
        self.out_dir = out_dir
        self.progress = progress
        self.log_path = out_dir / log_name
        self.step_ms = scenario.step_ms
        self.steps = scenario.duration_ms // scenario.step_ms
        self.t0 = scenario.start_ms
        seeds = np.random.SeedSequence(scenario.seed).spawn(8)
        assert seeds[CAPACITY_STREAM].spawn_key == (1,)  # the schedule's; the others are ours
        self.rng_arrivals = np.random.default_rng(seeds[0])
        self.rng_latency = np.random.default_rng(seeds[2])
        self.rng_outcomes = np.random.default_rng(seeds[3])
        self.rng_delays = np.random.default_rng(seeds[4])
        self.rng_labels = np.random.default_rng(seeds[6])
        self.request_seeds = seeds[5].spawn(len(scenario.regions))
        self.precompute_seeds = seeds[7].spawn(len(scenario.regions))
        self.plane: ControlPlane = make_plane(
            self.controller, scenario.control, [r.name for r in scenario.regions],
            static=scenario.controllers.static, naive=scenario.controllers.naive)
        self._messages = MessageQueue()
        self.targets_by_reason: dict[str, int] = {}
        self.effective: dict[str, ControlTargets] = {}
        self.regions: dict[str, RegionState] = {}
        #: Per region, (overload units shed, optional units done) so far, once a second.
        self._seconds: dict[str, list[tuple[int, int]]] = {}
        #: Per region, the seconds (from the start) a notice reached its replicas in.
        self._notice_seconds: dict[str, set[int]] = {}
        self.log: EventLogWriter | None = None
        self.metrics: Metrics | None = None
        self.events_published = 0
        #: The truth of the labels the control plane joins.
        self.attribution = Attribution(self.t0)
        #: The requests' path through the fleet and its replica sets, built by ``run``.
        self.requests: RequestPath
        self.capacity: Capacity

    # -- set-up ------------------------------------------------------------------------------

    def _build(self, metrics: Metrics) -> None:
        """The regions with their clients, the requests' path through them, and their
        capacity (the schedule, and the replica sets: the baseline ones made now)."""
        for i, rc in enumerate(self.sc.regions):
            self.regions[rc.name] = state = self._region(
                rc, np.random.default_rng(self.request_seeds[i]))
            if self.sc.precompute.enabled:
                state.precompute = RegionPrecompute(
                    self.sc.precompute, rc, int(self.precompute_seeds[i].generate_state(1)[0]),
                    delay_ms=self.sc.delays.targets_ms,
                    holdout_fraction=self.sc.client.holdout_fraction,
                    answer_holdout_fraction=self.sc.client.answer_holdout_fraction)
        self.requests = RequestPath(
            self.sc, self.regions, metrics=metrics, messages=self._messages,
            attribution=self.attribution, rng_labels=self.rng_labels,
            rng_outcomes=self.rng_outcomes, deliver_until=self._deliver_until,
            publish=self._publish)
        self.capacity = Capacity(
            self.sc, self.base_dir, self.regions, metrics=metrics, messages=self._messages,
            requests=self.requests, rng_latency=self.rng_latency, rng_delays=self.rng_delays,
            targets_in_force=self.effective.get, publish=self._publish)

    def _region(self, rc: RegionConfig, rng: np.random.Generator) -> RegionState:
        sc = self.sc
        counts = arrival_counts(rc.arrivals, self.steps, self.step_ms, self.base_dir,
                                self.rng_arrivals)
        shares = np.array([s.share for s in rc.segments], dtype=np.float64)
        has_powerful = any(p.model == "powerful" for p in rc.pools)
        client: SimClient
        if self.controller == "naive":
            client = NaiveClient(rc.name, sc.client, sc.controllers.naive)
        else:
            client = SurplusClient(rc.name, sc.client, powerful=has_powerful,
                                   seed=sc.seed * 1000 + len(self.regions))
        state = RegionState(
            config=rc, client=client, arrivals=counts, rng=rng,
            segment_names=[s.name for s in rc.segments],
            segment_cdf=np.cumsum(shares / shares.sum()),
            segment_values=np.array([s.value for s in rc.segments]),
            segment_value_noise=np.array([s.value_noise for s in rc.segments]),
            has_powerful=has_powerful)
        for pool in rc.pools:
            if pool.tier != "baseline":
                state.opportunistic.append(OppPool(pool, pool.pool_id(rc.name)))
        return state

    # -- publishing --------------------------------------------------------------------------

    def _publish(self, ts: int, topic: str, key: str, value: Event) -> None:
        """Into the log and into the control plane, in one order; targets it answers with are
        published and scheduled for delivery."""
        assert self.log is not None
        self.log.write_value(ts, topic, key, value)
        self.events_published += 1
        for targets in self.plane.feed(make_event(ts, topic, key, value)):
            self._emit(targets)

    def _emit(self, targets: ControlTargets) -> None:
        assert self.log is not None
        self.log.write_value(targets.issued_at_ms, "targets", targets.scope, targets)
        self.targets_by_reason[targets.reason] = self.targets_by_reason.get(targets.reason,
                                                                            0) + 1
        if self.metrics is not None:
            self.metrics.targets_emitted(targets)
        if isinstance(self.plane, SurplusPlane) and targets.reason == "period":
            self._track_order(targets)
            controller = self.plane.driver.controllers.get(targets.scope)
            if controller is not None:  # what the live plane publishes on the estimates topic
                self.log.write_value(targets.issued_at_ms, "estimates", targets.scope,
                                     controller.lift_report(targets.issued_at_ms))
        self._messages.send(targets.issued_at_ms + self.sc.delays.targets_ms,
                            TargetsArrive(targets))

    def _track_order(self, targets: ControlTargets) -> None:
        state = self.regions.get(targets.scope)
        if state is None:
            return
        controller = self.plane.driver.controllers.get(targets.scope)  # type: ignore[attr-defined]
        joined = 0 if controller is None else controller.join.counts["joined"]
        self.attribution.track_order(targets, {s.name: s.gain for s in state.config.segments},
                                     joined)

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Step the whole scenario, writing the event log and the timeline as it goes; the
        summary, with the wall time under ``_wall_s`` for the caller to report and drop (a
        summary must not differ between two runs of one seed)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        meter = Progress(f"simulate {self.sc.name} [{self.controller}]", enabled=self.progress)
        with EventLogWriter(self.log_path) as log, \
                (self.out_dir / "timeline.csv").open("w", encoding="utf-8",
                                                     newline="") as timeline:
            self.log = log
            sla = {r.name: r.sla_p99_ms or self.sc.control.rma.sla_p99_ms
                   for r in self.sc.regions}
            self.metrics = Metrics(sla, timeline, self.t0,
                                   deadlines={r.name: r.deadline_ms for r in self.sc.regions},
                                   precompute=self.sc.precompute.enabled)
            self._build(self.metrics)
            for k in range(self.steps):
                self._step(k)
                if not k % 200:
                    meter.update(f"{k * self.step_ms / 1000:,.0f}/{self.sc.duration_s:,.0f} s "
                                 f"simulated")
            self._boundary(self.steps)
            for targets in self.plane.finish():
                self._emit(targets)
        meter.done(f"{self.sc.duration_s:,.0f} s simulated, {self.events_published:,} events "
                   f"-> {self.log_path}")
        summary = self._summary()
        summary["_wall_s"] = time.monotonic() - started
        return summary

    def _boundary(self, k: int) -> None:
        """Telemetry, capacity changes and control ticks at the start of step ``k``."""
        t = self.t0 + k * self.step_ms
        if k and not (k * self.step_ms) % self.sc.report_ms:
            for state in self.regions.values():
                for worker in state.workers():
                    self._publish(t, "telemetry", state.config.name, worker.report(t))
        if k < self.steps:
            self.capacity.step(k, t)
        else:  # the end: revoke what is still lent, before the last tick (as replay orders it)
            self.capacity.close(t)
        for targets in self.plane.advance(t):
            self._emit(targets)

    def _step(self, k: int) -> None:
        self._boundary(k)
        t = self.t0 + k * self.step_ms
        end = t + self.step_ms
        for state in self.regions.values():
            if state.precompute is not None:
                state.precompute.ask(t)
            self.requests.arrivals(state, k, t)
        self._deliver_until(end)
        for state in self.regions.values():
            for worker in state.workers():
                worker.advance(end)
            for worker in sorted(state.served_this_step, key=lambda w: w.worker_id):
                state.client.observe(worker.server_state(end), end, model=worker.pool.model,
                                     replica=worker.worker_id)
            state.served_this_step.clear()
        self.capacity.account(t, end)
        self.requests.outcomes(end)
        self.requests.deliver_labels(end)
        if (end - self.t0) // 1000 > (t - self.t0) // 1000:
            self._per_second()
        if not (end - self.t0) % self.sc.sla_window_ms:
            self._close_windows(end)

    # -- messages ----------------------------------------------------------------------------

    def _deliver_until(self, until: float) -> None:
        """Deliver every message due before ``until`` (targets, notices, deadlines)."""
        for at, message in self._messages.due_before(until):
            now = int(at)
            match message:
                case TargetsArrive(targets):
                    self._deliver_targets(targets, now)
                case NoticeArrives(notice):
                    self._deliver_notice(notice, now)
                case CapacityDue(action):
                    self.capacity.due(action, now)
                case ReplicasLeave(region, worker):
                    self.capacity.leave(region, worker, now)
                case PowerfulGivesUp(region, req):
                    self.requests.give_up(region, req, now)

    def _deliver_targets(self, targets: ControlTargets, now: int) -> None:
        state = self.regions.get(targets.scope)
        if state is None:
            return
        self.effective[targets.scope] = targets
        for worker in state.workers():
            worker.offer_targets(targets, now)
        state.client.offer(targets, now)

    def _deliver_notice(self, notice: PreemptionNotice, now: int) -> None:
        state = self.regions[notice.region]
        assert self.metrics is not None
        self._notice_seconds.setdefault(notice.region, set()).add((now - self.t0) // 1000)
        for worker in state.workers():
            if worker.preempt(notice, now) == "applied":
                self.metrics.notice_applied(notice.ts_ms, float(now))

    # -- accounting ------------------------------------------------------------------------

    def _close_windows(self, end: int) -> None:
        assert self.metrics is not None
        for name, state in self.regions.items():
            targets = self.effective.get(name)
            replicas = sum(pool.lent for pool in state.opportunistic)
            shed = sum(self.capacity.shed(name).values())
            self.metrics.close_window(
                end, name, extra_target=targets.rma.extra_candidates if targets else 0,
                coverage=targets.sbm.coverage if targets else 0.0,
                opportunistic_replicas=replicas, shed_total=shed)

    def _per_second(self) -> None:
        """Each region's overload sheds and optional units done so far, once a second (what
        ``sim.overload`` judges against the seconds a burst or a notice excuses)."""
        assert self.metrics is not None
        for name in self.regions:
            shed = self.capacity.shed(name).get("overload", 0)
            done = self.metrics.regions[name].optional_done
            self._seconds.setdefault(name, []).append((shed, done))

    def _overload_summary(self) -> dict[str, float | None]:
        shed, done, excused_s = [], [], []
        for name, state in sorted(self.regions.items()):
            totals = np.array([(0, 0), *self._seconds.get(name, [])], dtype=float)
            per_s = np.diff(totals, axis=0)
            seconds = (np.arange(len(state.arrivals)) * self.step_ms) // 1000
            arrivals = np.bincount(seconds, weights=state.arrivals)[:len(per_s)]
            notices = sorted(self._notice_seconds.get(name, set()))
            shed.append(per_s[:, 0])
            done.append(per_s[:, 1])
            excused_s.append(excused(arrivals, notices))
        return overload_shares(np.concatenate(shed), np.concatenate(done),
                               np.concatenate(excused_s))

    # -- summary -----------------------------------------------------------------------------

    def _summary(self) -> dict[str, Any]:
        assert self.metrics is not None
        summary = self.metrics.summary()
        shed = self.capacity.shed()
        summary["optional_units_shed"] = dict(sorted(shed.items()))
        summary["optional_units_shed_total"] = sum(shed.values())
        summary.update(self._overload_summary())
        summary["targets_by_reason"] = dict(sorted(self.targets_by_reason.items()))
        lever = {name: state.precompute.summary()
                 for name, state in sorted(self.regions.items()) if state.precompute is not None}
        if lever:
            summary["precompute"] = lever
        summary["clients"] = {name: state.client.counters()
                              for name, state in sorted(self.regions.items())}
        summary["events"] = self.events_published + sum(self.targets_by_reason.values())
        if isinstance(self.plane, SurplusPlane):
            summary.update(self.attribution.summary(self.plane, list(self.regions)))
        summary.update({"scenario": self.sc.name, "controller": self.controller,
                        "seed": self.sc.seed, "duration_s": self.sc.duration_s,
                        "log": self.log_path.name})
        return summary
