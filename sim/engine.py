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
are child ``sim.schedule.CAPACITY_STREAM``), and arrivals are drawn before the run: every
controller compared on a scenario gets exactly the same requests.
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
from sim.requests import RequestPath
from sim.scenario import PoolConfig, RegionConfig, Scenario
from sim.schedule import CAPACITY_STREAM, Action, Outbox, build, replica_id
from sim.traces import arrival_counts
from sim.worker import NormalBlock, SimWorker
from streams.eventlog import EventLogWriter, make_event
from streams.replay_output import Progress


class Simulation:
    """One run of a scenario under one controller; ``run`` writes the log and returns the
    summary. Requests take their path through the fleet in ``sim.requests.RequestPath``,
    which ``run`` builds with the fleet and the engine drives."""

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
        self.plane: ControlPlane = make_plane(
            self.controller, scenario.control, [r.name for r in scenario.regions],
            static=scenario.controllers.static, naive=scenario.controllers.naive)
        self._messages = MessageQueue()
        self._noise: dict[str, NormalBlock] = {}
        self.targets_by_reason: dict[str, int] = {}
        self.effective: dict[str, ControlTargets] = {}
        self.regions: dict[str, RegionState] = {}
        self.pools: dict[str, OppPool] = {}
        self.actions: list[Action] = []
        self._next_action = 0
        self.outbox = Outbox()
        self.created: dict[str, list[SimWorker]] = {}
        self.log: EventLogWriter | None = None
        self.metrics: Metrics | None = None
        self.events_published = 0
        #: The truth of the labels the control plane joins.
        self.attribution = Attribution(self.t0)
        #: The requests' path through the fleet, built by ``run`` with the fleet.
        self.requests: RequestPath

    # -- set-up ------------------------------------------------------------------------------

    def _build(self, metrics: Metrics) -> None:
        """The capacity schedule, the regions with their clients and baseline replica sets,
        and the requests' path through them."""
        self.actions = build(self.sc, self.base_dir)
        for i, rc in enumerate(self.sc.regions):
            self.regions[rc.name] = self._region(rc, np.random.default_rng(self.request_seeds[i]))
        self.requests = RequestPath(
            self.sc, self.regions, metrics=metrics, messages=self._messages,
            attribution=self.attribution, rng_labels=self.rng_labels,
            rng_outcomes=self.rng_outcomes, deliver_until=self._deliver_until,
            publish=self._publish)
        for state in self.regions.values():
            for pool in state.config.pools:
                if pool.tier == "baseline":
                    state.baseline_workers.append(
                        self._worker(pool, state.config.name, pool.replicas, 0))
            state.repick()

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
                opp = self.pools[pool.pool_id(rc.name)] = OppPool(pool, pool.pool_id(rc.name))
                state.opportunistic.append(opp)
        return state

    def _worker(self, pool: PoolConfig, region: str, replicas: int, index: int,
                at_ms: int | None = None) -> SimWorker:
        pool_id = pool.pool_id(region)
        noise = self._noise.get(pool_id)
        if noise is None:
            noise = self._noise[pool_id] = NormalBlock(self.rng_latency, pool.latency_sigma)
        worker = SimWorker(pool, region, replica_id(region, pool, index), replicas,
                           admission=self.sc.worker.admission, limits=self.sc.worker.limits,
                           start_ms=self.t0 if at_ms is None else at_ms, noise=noise,
                           on_done=self.requests.done, on_shed=self.requests.shed)
        self.created.setdefault(region, []).append(worker)
        return worker

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
                                   deadlines={r.name: r.deadline_ms for r in self.sc.regions})
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
            self._capacity(k, t)
        else:  # the end: revoke what is still lent, before the last tick (as replay orders it)
            for action in self.outbox.closing(self.sc.duration_ms):
                self._send(action, t)
        for targets in self.plane.advance(t):
            self._emit(targets)

    def _step(self, k: int) -> None:
        self._boundary(k)
        t = self.t0 + k * self.step_ms
        end = t + self.step_ms
        for state in self.regions.values():
            self.requests.arrivals(state, k, t)
        self._deliver_until(end)
        for state in self.regions.values():
            for worker in state.workers():
                worker.advance(end)
            for worker in sorted(state.served_this_step, key=lambda w: w.worker_id):
                state.client.observe(worker.server_state(end), end, model=worker.pool.model)
            state.served_this_step.clear()
        self._account(t, end)
        self.requests.outcomes(end)
        self.requests.deliver_labels(end)
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
                    if self._send(action, now):
                        self.regions[action.region].repick()
                case ReplicasLeave(region, worker):
                    self._evict(region, worker, now)
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
        for worker in state.workers():
            if worker.preempt(notice, now) == "applied":
                self.metrics.notice_applied(notice.ts_ms, float(now))

    def _evict(self, region: str, worker: SimWorker, now: int) -> None:
        """The deadline: the replicas leave; their queued baseline work moves to others."""
        state = self.regions[region]
        if worker not in state.draining:
            return
        state.draining.remove(worker)
        for req in worker.evict(now):
            self.requests.moved(state, req, now)

    # -- the capacity schedule --------------------------------------------------------------

    def _capacity(self, k: int, t: int) -> None:
        """Send the schedule's actions due in step ``k``: those at its start now, the others
        (revokes at a deadline) at their own millisecond."""
        actions, changed = self.actions, set()
        end = (k + 1) * self.step_ms
        while self._next_action < len(actions) and actions[self._next_action].at_ms < end:
            action = actions[self._next_action]
            self._next_action += 1
            if self.t0 + action.at_ms <= t:
                if self._send(action, t):
                    changed.add(action.region)
            else:
                self._messages.send(self.t0 + action.at_ms, CapacityDue(action))
        for name, state in self.regions.items():
            if name in changed:
                state.repick()

    def _send(self, action: Action, t: int) -> bool:
        """Publish ``action`` at ``t`` and apply it to the fleet; True if replica sets changed."""
        pool = self.pools[action.pool_id]
        state = self.regions[action.region]
        message = self.outbox.stamp(action, t)
        changed = False
        if action.kind == "grant" and action.replicas > pool.lent:
            self._lend(state, pool, action.replicas - pool.lent, t)
            changed = True
        elif action.kind == "notice" and action.repeat:
            assert isinstance(message, PreemptionNotice)
            self._announce(message)
        elif action.kind == "notice":
            assert isinstance(message, PreemptionNotice)
            self._reclaim(state, pool, action.replicas, message)
            changed = True
        assert action.kind != "grant" or action.replicas == pool.lent, "shrunk without notice"
        self._publish(t, action.topic, action.region, message)
        return changed

    def _lend(self, state: RegionState, pool: OppPool, replicas: int, t: int) -> None:
        """A new replica set of the next ``replicas`` replicas, with the targets in force."""
        worker = self._worker(pool.config, state.config.name, replicas, pool.lent, t)
        current = self.effective.get(state.config.name)
        if current is not None:
            worker.offer_targets(current, t)
        pool.live.append(worker)
        pool.lent += replicas

    def _reclaim(self, state: RegionState, pool: OppPool, replicas: int,
                 notice: PreemptionNotice) -> None:
        """The newest ``replicas`` replicas drain until the notice's deadline, newest replica
        sets first (the last one split if needed); the notice reaches them after a delay."""
        t = notice.ts_ms
        taken: list[SimWorker] = []
        left = replicas
        while left > 0 and pool.live:
            newest = pool.live[-1]
            if newest.replicas <= left:
                pool.live.pop()
                taken.append(newest)
                left -= newest.replicas
            else:
                newest.replicas -= left
                taken.append(self._worker(pool.config, state.config.name, left,
                                          pool.lent - replicas, t))
                left = 0
        pool.lent -= replicas
        delivered = self._announce(notice)
        # A notice with less lead time than its delivery (zero notice, a hardware failure) is
        # acted on when it arrives: the replicas leave then, having shed their optional work.
        leave = max(float(notice.deadline_ms), delivered)
        for worker in taken:
            worker.draining_deadline_ms = notice.deadline_ms
            state.draining.append(worker)
            self._messages.send(leave, ReplicasLeave(state.config.name, worker))

    def _announce(self, notice: PreemptionNotice) -> float:
        """The notice reaches the replicas it names after a (modelled) delivery delay; returns
        when."""
        t = notice.ts_ms
        assert self.metrics is not None
        self.metrics.notice_issued(t)
        delay = float(self.rng_delays.uniform(self.sc.delays.notice_min_ms,
                                              self.sc.delays.notice_max_ms))
        self._messages.send(t + delay, NoticeArrives(notice))
        return t + delay

    # -- accounting ------------------------------------------------------------------------

    def _account(self, t: int, end: int) -> None:
        assert self.metrics is not None
        span_s = (end - t) / 1000.0
        for state in self.regions.values():
            for pool in state.opportunistic:
                for worker in pool.live:
                    self._use(worker, span_s)
            for worker in state.draining:
                if worker.pool.tier == "opportunistic":
                    self._use(worker, span_s)

    def _use(self, worker: SimWorker, span_s: float) -> None:
        assert self.metrics is not None
        self.metrics.opportunistic_available_s += worker.replicas * span_s
        used = worker.served_units / worker.pool.units_per_s
        worker.served_units = 0
        self.metrics.opportunistic_used_s += used

    def _close_windows(self, end: int) -> None:
        assert self.metrics is not None
        for name, state in self.regions.items():
            targets = self.effective.get(name)
            replicas = sum(pool.lent for pool in state.opportunistic)
            shed = sum(sum(w.admission.shed_units.values()) for w in self.created[name])
            self.metrics.close_window(
                end, name, extra_target=targets.rma.extra_candidates if targets else 0,
                coverage=targets.sbm.coverage if targets else 0.0,
                opportunistic_replicas=replicas, shed_total=shed)

    # -- summary -----------------------------------------------------------------------------

    def _summary(self) -> dict[str, Any]:
        assert self.metrics is not None
        summary = self.metrics.summary()
        shed: dict[str, int] = {}
        for region in sorted(self.created):
            for worker in self.created[region]:
                for reason, n in worker.admission.shed_units.items():
                    shed[reason] = shed.get(reason, 0) + n
        summary["optional_units_shed"] = dict(sorted(shed.items()))
        summary["optional_units_shed_total"] = sum(shed.values())
        summary["targets_by_reason"] = dict(sorted(self.targets_by_reason.items()))
        summary["clients"] = {name: state.client.counters()
                              for name, state in sorted(self.regions.items())}
        summary["events"] = self.events_published + sum(self.targets_by_reason.values())
        if isinstance(self.plane, SurplusPlane):
            summary.update(self.attribution.summary(self.plane, list(self.regions)))
        summary.update({"scenario": self.sc.name, "controller": self.controller,
                        "seed": self.sc.seed, "duration_s": self.sc.duration_s,
                        "log": self.log_path.name})
        return summary
