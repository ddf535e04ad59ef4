"""The fleet's capacity as the schedule changes it: replica sets lent by grants, drained by
notices and gone at their deadline.

The capacity schedule (``sim.schedule``) says when each opportunistic pool's replicas are
granted, renewed, reclaimed and revoked. ``Capacity`` sends each action at its simulated time
(those inside a step at their own millisecond, through the message queue), publishes it, and
applies it to the fleet: a grant past what is lent starts a replica set of the next replicas,
with the targets in force; a notice drains the newest replicas (the newest sets first, the
last one split if needed) until its deadline, and reaches them after a random delivery delay;
at the deadline they leave, and their queued baseline work moves to other ranking replicas.
It makes every replica set (the baseline ones when it is constructed), and counts the
accelerator time the lent replicas were offered and used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from schemas.contract import ControlTargets, Event, PreemptionNotice
from sim.fleet import OppPool, RegionState
from sim.messages import CapacityDue, MessageQueue, NoticeArrives, ReplicasLeave
from sim.metrics import Metrics
from sim.precompute import IdleJobs
from sim.requests import RequestPath
from sim.scenario import PoolConfig, Scenario
from sim.schedule import Action, Outbox, build, replica_id
from sim.worker import NormalBlock, SimWorker


class Capacity:
    """The replica sets of a run's regions, and the capacity schedule applied to them."""

    def __init__(self, scenario: Scenario, base_dir: Path, regions: Mapping[str, RegionState],
                 *, metrics: Metrics, messages: MessageQueue, requests: RequestPath,
                 rng_latency: np.random.Generator, rng_delays: np.random.Generator,
                 targets_in_force: Callable[[str], ControlTargets | None],
                 publish: Callable[[int, str, str, Event], None]) -> None:
        """
        :param scenario: the run's scenario (its pools, notice delays and worker settings).
        :param base_dir: the scenario's directory, where the schedule reads its traces.
        :param regions: every region of the run, by name, with its opportunistic pools; its
            baseline replica sets are made here.
        :param metrics: counts notices and the accelerator time lent and used.
        :param messages: the queue that actions inside a step, notices on their way and
            reclaimed replica sets' deadlines are sent on.
        :param requests: what replica sets report answers and sheds to, and where the queued
            baseline work of a set that leaves moves.
        :param rng_latency: the latency noise of the replica sets (a block per pool).
        :param rng_delays: draws each notice's delivery delay.
        :param targets_in_force: the targets a region's new replica set starts with, if any.
        :param publish: the engine's publishing, to the event log and the control plane.
        """
        self.sc = scenario
        self.t0 = scenario.start_ms
        self.step_ms = scenario.step_ms
        self.regions = regions
        self.pools: dict[str, OppPool] = {
            pool.pool_id: pool for state in regions.values() for pool in state.opportunistic}
        self.metrics = metrics
        self._messages = messages
        self._requests = requests
        self._rng_latency = rng_latency
        self._rng_delays = rng_delays
        self._targets_in_force = targets_in_force
        self._publish = publish
        self.actions: list[Action] = build(scenario, base_dir)
        self._next_action = 0
        self.outbox = Outbox()
        #: Every replica set made, by region (those gone included).
        self.created: dict[str, list[SimWorker]] = {}
        self._noise: dict[str, NormalBlock] = {}
        for state in regions.values():   # the provisioned replicas, there from the start
            for pool in state.config.pools:
                if pool.tier == "baseline":
                    state.baseline_workers.append(
                        self.worker(pool, state.config.name, pool.replicas, 0))
            state.repick()

    def worker(self, pool: PoolConfig, region: str, replicas: int, index: int,
               at_ms: int | None = None) -> SimWorker:
        """A replica set of ``replicas`` replicas of ``pool``, from replica ``index``."""
        pool_id = pool.pool_id(region)
        noise = self._noise.get(pool_id)
        if noise is None:
            noise = self._noise[pool_id] = NormalBlock(self._rng_latency, pool.latency_sigma)
        worker = SimWorker(pool, region, replica_id(region, pool, index), replicas,
                           admission=self.sc.worker.admission, limits=self.sc.worker.limits,
                           start_ms=self.t0 if at_ms is None else at_ms, noise=noise,
                           on_done=self._requests.done, on_shed=self._requests.shed)
        lever = self.regions[region].precompute
        if lever is not None and pool.tier == "opportunistic" and pool.model in lever.topics:
            worker.idle = IdleJobs(worker, lever.topics[pool.model], lever,
                                   self.sc.worker.precompute)
        self.created.setdefault(region, []).append(worker)
        return worker

    # -- the schedule ------------------------------------------------------------------------

    def step(self, k: int, t: int) -> None:
        """Send the schedule's actions due in step ``k``: those at its start now, the others
        (revokes at a deadline) at their own millisecond."""
        actions, changed = self.actions, set()
        end = (k + 1) * self.step_ms
        while self._next_action < len(actions) and actions[self._next_action].at_ms < end:
            action = actions[self._next_action]
            self._next_action += 1
            if self.t0 + action.at_ms <= t:
                if self.send(action, t):
                    changed.add(action.region)
            else:
                self._messages.send(self.t0 + action.at_ms, CapacityDue(action))
        for name, state in self.regions.items():
            if name in changed:
                state.repick()

    def due(self, action: Action, now: int) -> None:
        """An action due inside a step, at its own millisecond."""
        if self.send(action, now):
            self.regions[action.region].repick()

    def close(self, t: int) -> None:
        """The end: revoke what is still lent."""
        for action in self.outbox.closing(self.sc.duration_ms):
            self.send(action, t)

    def send(self, action: Action, t: int) -> bool:
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
        worker = self.worker(pool.config, state.config.name, replicas, pool.lent, t)
        current = self._targets_in_force(state.config.name)
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
                taken.append(self.worker(pool.config, state.config.name, left,
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
        self.metrics.notice_issued(t)
        delay = float(self._rng_delays.uniform(self.sc.delays.notice_min_ms,
                                               self.sc.delays.notice_max_ms))
        self._messages.send(t + delay, NoticeArrives(notice))
        return t + delay

    def leave(self, region: str, worker: SimWorker, now: int) -> None:
        """The deadline: the replicas leave; their queued baseline work moves to others."""
        state = self.regions[region]
        if worker not in state.draining:
            return
        state.draining.remove(worker)
        for req in worker.evict(now):
            self._requests.moved(state, req, now)

    # -- accounting --------------------------------------------------------------------------

    def account(self, t: int, end: int) -> None:
        """Accelerator time the lent replicas (draining ones included) were offered and used
        from ``t`` to ``end``."""
        span_s = (end - t) / 1000.0
        for state in self.regions.values():
            for pool in state.opportunistic:
                for worker in pool.live:
                    self._use(worker, span_s)
            for worker in state.draining:
                if worker.pool.tier == "opportunistic":
                    self._use(worker, span_s)

    def _use(self, worker: SimWorker, span_s: float) -> None:
        self.metrics.opportunistic_available_s += worker.replicas * span_s
        used = worker.served_units / worker.pool.units_per_s
        worker.served_units = 0
        self.metrics.opportunistic_used_s += used

    def shed(self, region: str | None = None) -> dict[str, int]:
        """Optional units the replica sets shed, by reason: of one region, or of all."""
        shed: dict[str, int] = {}
        for name in sorted(self.created) if region is None else [region]:
            for worker in self.created.get(name, []):
                for reason, n in worker.admission.shed_units.items():
                    shed[reason] = shed.get(reason, 0) + n
        return shed
