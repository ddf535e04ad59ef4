"""A simulated worker: a set of replicas behind the real worker policies, on a fluid server.

The policies are the live ones, composed as ``workers/runtime/worker.py`` composes them:
``TargetState`` decides whether optional work may run at all (missing, stale or preempted
targets mean baseline only), ``Admission`` queues baseline work first and optional work by
value and sheds it by overload, deadline, preemption and budget. What replaces the torch model
and the batcher thread is a fluid server (``FluidServer``): the replicas score ``units_per_s``
candidates a second each, batches are taken from admission in its order and take
``units / rate`` to run.

The server shares its replicas among the work in service, like a processor-sharing queue: up
to ``inflight_ms`` worth of work is in service at once and drains at the replicas' rate, so
below saturation nothing waits, and a request's latency is a service time drawn around the
pool's latency-vs-utilisation curve (lognormal noise), where utilisation is the recent busy
share of the replicas. That curve is where contention lives: optional work on the same
replicas makes baseline requests slower long before any queue forms, which is what the RMA
controller has to regulate. Past saturation, work waits in admission's queues (baseline
first) and its latency adds that wait: that is when admission sheds and clients back off.

Replica sets are the unit of preemption: a notice names some replicas, those become a worker
of their own that drains until the deadline, receives no new requests, and sheds its optional
work the moment the notice arrives.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from schemas.contract import ControlTargets, PreemptionNotice, WindowReport
from sim.scenario import PoolConfig
from workers.api import ServerState
from workers.policy.admission import Admission, AdmissionConfig, shed_priority
from workers.policy.replica import NoticeOutcome, ReplicaPolicy, serves_whole_requests
from workers.policy.targets import LocalLimits, TargetState, TargetVerdict
from workers.policy.window import Identity, LoadTotals, ReportWindow

if TYPE_CHECKING:
    from sim.precompute import IdleJobs

UTIL_TAU_MS = 1000.0

BASE, OPT, WHOLE = 0, 1, 2


class LatencyCurve:
    """Median latency (ms) at a utilisation, linearly interpolated between the points."""

    def __init__(self, points: tuple[tuple[float, float], ...]) -> None:
        self.xs = [float(u) for u, _ in points]
        self.ys = [float(ms) for _, ms in points]

    def __call__(self, utilisation: float) -> float:
        xs, ys = self.xs, self.ys
        if utilisation <= xs[0]:
            return ys[0]
        for i in range(1, len(xs)):
            if utilisation <= xs[i]:
                f = (utilisation - xs[i - 1]) / (xs[i] - xs[i - 1])
                return ys[i - 1] + f * (ys[i] - ys[i - 1])
        return ys[-1]


class FluidServer:
    """A replica set's replicas as one fluid server: each scores ``units_per_s`` units a
    second, up to ``inflight_ms`` worth of work is in service at once and drains at their
    rate, and the recent busy share (decaying over ``UTIL_TAU_MS``) is the utilisation the
    latency curve is read at."""

    def __init__(self, units_per_s: float, inflight_ms: float, replicas: int,
                 start_ms: int) -> None:
        self.units_per_s = units_per_s
        self.inflight_ms = inflight_ms
        self.clock = float(start_ms)
        """How far the work in service has drained."""
        self.in_service = 0.0
        self.busy_ms = 0.0
        """How long (ms) the replicas took to serve the work taken into service so far."""
        self._util_acc = 0.0
        self._replicas = 0
        self.rate_per_ms = 0.0
        self.room = 1.0
        """Work the replicas take into service at once (batches in flight)."""
        self.replicas = replicas

    @property
    def replicas(self) -> int:
        return self._replicas

    @replicas.setter
    def replicas(self, n: int) -> None:
        self._replicas = n
        self.rate_per_ms = n * self.units_per_s / 1000.0
        self.room = max(1.0, self.rate_per_ms * self.inflight_ms)

    def utilisation(self) -> float:
        return self._util_acc / (max(self.rate_per_ms, 1e-9) * UTIL_TAU_MS)

    def free_at(self) -> float:
        """When there is room for more work in service (its clock, if there is now)."""
        return self.clock + max(0.0, (self.in_service - self.room) / self.rate_per_ms)

    def take(self, units: int) -> float:
        """``units`` enter service; returns how long (ms) the replicas take to serve them."""
        cost = units / self.rate_per_ms
        self.in_service += units
        self._util_acc += units
        self.busy_ms += cost
        return cost

    def take_idle(self, units: float) -> float:
        """Idle work (a precompute slice) enters service. It holds the replicas while it
        runs, but it is not concurrent with requests the way a batch is: a live worker runs
        a slice only while no request is queued, and a request that arrives waits for the
        slice in hand at most (``chunk_ms``), so it is left out of the utilisation the
        latency curve reads. Nor is it any request's cost, so it stays out of ``busy_ms`` (a
        live worker's reports count the batcher's passes only)."""
        self.in_service += units
        return units / self.rate_per_ms

    def drain_to(self, t: float) -> None:
        """The work in service drains, and the busy share decays, until ``t``."""
        span = t - self.clock
        if span <= 0:
            return
        self.in_service = max(0.0, self.in_service - span * self.rate_per_ms)
        self._util_acc *= math.exp(-span / UTIL_TAU_MS)
        self.clock = t


@dataclass(slots=True, eq=False)
class Request:
    """One ranking request through the fleet (plain data; the engine owns its life cycle)."""

    rid: int
    arrival_ms: int
    segment: int
    value: float
    base: int
    extra: int
    model: str = "baseline"
    explored: bool = False
    gain: float | None = None
    """What the client expects its optional work to add (the shedding order, see
    ``shed_priority``)."""
    at_worker_ms: float = 0.0
    """When it reached the ranking worker that serves it (after any fallback)."""
    base_latency: float | None = None
    opt_units: int = 0
    """Extra candidates admitted (ranking replica) or kept with the request (powerful one;
    still so after a fallback, which scores none on the ranking pool)."""
    opt_pending: bool = False
    opt_latency: float = 0.0
    opt_done: bool = False
    powerful_done: bool = False
    fell_back: bool = False
    worker: SimWorker | None = None
    """The replica set that answers it (a ranking one after a fallback)."""
    powerful: SimWorker | None = None
    """The powerful replica set it was sent to, kept after a fallback: that replica still
    answers it, and reports the work."""
    finished_ms: float = 0.0
    available: int = 0
    """Extra candidates the caller had for it (none where a precompute answer serves it)."""
    precomputed: float | None = None
    """What the precompute answer it uses is worth (`sim.precompute`); None: none."""


class SimWorker:
    """One replica set of one pool (see the module docstring)."""

    def __init__(self, pool: PoolConfig, region: str, worker_id: str, replicas: int, *,
                 admission: AdmissionConfig, limits: LocalLimits, start_ms: int,
                 noise: Callable[[], float], on_done: Callable[[Request, int, float], None],
                 on_shed: Callable[[Request, int, str, float], None]) -> None:
        self.pool = pool
        self.pool_id = pool.pool_id(region)
        self.region = region
        self.worker_id = worker_id
        self.server = FluidServer(pool.units_per_s, pool.inflight_ms, replicas, start_ms)
        self.curve = LatencyCurve(pool.latency_curve)
        warm = msgspec.structs.replace(
            admission, initial_ms_per_unit=min(10_000.0, 1000.0 / max(
                replicas * pool.units_per_s, 1e-6)))
        self.admission: Admission[tuple[Request, int]] = Admission(
            warm, on_shed=self._shed, whole_requests=serves_whole_requests(pool.model, pool.tier))
        self.policy = ReplicaPolicy(pool_id=self.pool_id, worker_id=worker_id, region=region,
                                    limits=limits, started_ms=start_ms)
        self.noise = noise
        self.on_done = on_done
        self.on_shed_item = on_shed
        self.now = float(start_ms)
        self.draining_deadline_ms: int | None = None
        self.stopped_optional_ms: float | None = None
        self._window = ReportWindow(Identity(
            pool_id=self.pool_id, worker_id=worker_id, region=region, service=pool.service,
            model=pool.model, tier=pool.tier, accelerator=pool.accelerator), start_ms)
        self.served_units = 0
        """Units taken into service since the engine last accounted for them (it resets)."""
        self.rows_done = 0
        """Units taken into service since the start (cumulative, as the live batcher counts)."""
        self.idle: IdleJobs | None = None
        """The precompute lever's work for its idle time (`sim.precompute`), where it runs."""

    @property
    def targets(self) -> TargetState:
        return self.policy.targets

    @property
    def budget_share(self) -> float:
        return self.policy.budget_share

    @budget_share.setter
    def budget_share(self, share: float) -> None:
        self.policy.budget_share = share

    # -- capacity ----------------------------------------------------------------------------

    @property
    def replicas(self) -> int:
        return self.server.replicas

    @replicas.setter
    def replicas(self, n: int) -> None:
        self.server.replicas = n

    @property
    def rate_per_ms(self) -> float:
        return self.server.rate_per_ms

    @property
    def ready(self) -> bool:
        """Takes new requests (a draining replica set is out of the load balancer)."""
        return self.draining_deadline_ms is None and self.replicas > 0

    # -- serving -----------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Run the server until ``now``: work in service drains at the replicas' rate, and
        queued work enters service, in admission's order, as soon as there is room."""
        adm, server = self.admission, self.server
        while adm.queued_items:
            free_at = server.free_at()
            if free_at > now:
                break
            server.drain_to(free_at)
            self.now = free_at
            batch = adm.next_batch(max(1, int(server.room - server.in_service)), int(free_at))
            if not batch:
                break
            units = sum(work.units for work in batch)
            adm.record_service(units, server.take(units))
            self.served_units += units
            self.rows_done += units
            service = self.curve(server.utilisation())
            for work in batch:
                req, kind = work.item
                wait = free_at - (req.at_worker_ms if kind != WHOLE else req.arrival_ms)
                self.on_done(req, kind, max(0.0, wait) + service * self.noise())
        if self.idle is not None and not adm.queued_items:
            self.idle.fill(now)
        server.drain_to(now)
        self.now = now

    # -- requests ----------------------------------------------------------------------------

    def submit_ranking(self, req: Request, now: int, deadline_ms: float) -> None:
        """Base candidates as baseline work; extra candidates as optional work, if allowed.

        A fallback can come from the past: a powerful replica finds a request past its
        deadline only when it next frees up, after this replica may have been run further.
        It reaches this replica at this replica's clock, so that the order in which the engine
        runs its replicas is not charged to the request as a wait in this queue.
        """
        now = max(now, math.ceil(self.server.clock))
        self.advance(now)
        req.worker = self
        req.at_worker_ms = now
        adm = self.admission
        adm.admit_baseline((req, BASE), now, units=req.base)
        extra = 0 if req.fell_back else req.extra
        if extra:
            self._admit_extra(req, extra, now, deadline_ms)
        self.advance(now)

    def _admit_extra(self, req: Request, extra: int, now: int, deadline_ms: float) -> None:
        """The live worker's rule: only as many as the targets allow, within the budget."""
        adm = self.admission
        allowance = self.policy.allow_extra(self.policy.current(now), extra)
        if allowance.new_budget is not None:
            adm.set_budget(allowance.new_budget, now, allowance.banked_units)
        allowed = allowance.allowed
        if allowance.refused is not None:
            adm.count_shed(allowance.refused, extra - allowed)
        allowed = adm.fit_optional(allowed)
        if allowed and adm.admit_optional((req, OPT), shed_priority(req.value, req.gain),
                                          int(now + deadline_ms), now, units=allowed):
            req.opt_units = allowed
            req.opt_pending = True

    def submit_whole(self, req: Request, now: int, deadline_ms: float) -> bool:
        """The powerful model: the whole request is optional work; False when refused."""
        self.advance(now)
        req.worker = req.powerful = self
        sent = req.base + req.extra
        refusal = self.policy.whole_refusal(self.policy.current(now))
        if refusal is not None:
            self.admission.count_shed(refusal, sent)
            self.record(0.0, False, sent, 0)  # as the live worker answers its 503
            return False
        allowance = self.policy.allow_whole_extra(self.policy.current(now), req.extra)
        if allowance.refused is not None:
            self.admission.count_shed(allowance.refused, req.extra - allowance.allowed)
        kept = self.admission.fit_whole(req.base, allowance.allowed)
        admitted = self.admission.admit_optional((req, WHOLE),
                                                 shed_priority(req.value, req.gain),
                                                 int(now + deadline_ms), now,
                                                 units=req.base + kept)
        if admitted:
            req.opt_units = kept
            self.advance(now)
        else:
            self.record(0.0, False, sent, 0)
        return admitted

    def _shed(self, item: tuple[Request, int], reason: str) -> None:
        req, kind = item
        if kind == WHOLE:  # a queued whole request dropped later: the live worker's 503
            self.record(self.now - req.arrival_ms, False, req.base + req.extra, 0)
        self.on_shed_item(req, kind, reason, self.now)

    def server_state(self, now: float) -> ServerState:
        adm = self.admission
        return ServerState(queue_delay_ms=max(0.0, adm.queue_delay_ms(int(now))),
                           in_flight=adm.queued_items,
                           shedding_level=adm.shedding_level(int(now)),
                           preempted=adm.preempted or self.targets.preempted,
                           optional_room=None if adm.whole_requests else adm.optional_room())

    # -- control messages --------------------------------------------------------------------

    def offer_targets(self, targets: ControlTargets, now: int) -> TargetVerdict:
        """As the live worker: new trusted targets after a preemption resume optional work."""
        verdict, resume = self.policy.offer(targets, now,
                                            admission_preempted=self.admission.preempted)
        if resume:
            self.admission.resume()
        return verdict

    def concerns(self, notice: PreemptionNotice) -> bool:
        return self.policy.concerns(notice)

    def preempt(self, notice: PreemptionNotice, now: int) -> NoticeOutcome:
        """The local fast path: stop optional work now, keep serving baseline until the
        deadline (the live worker's ``on_preemption``)."""
        outcome = self.policy.on_notice(notice, now)
        if outcome != "applied":
            return outcome
        self.advance(now)
        self.now = now
        self.admission.preempt(now)
        if self.idle is not None:
            self.idle.halt()
        self.draining_deadline_ms = notice.deadline_ms
        if self.stopped_optional_ms is None:
            self.stopped_optional_ms = float(now)
        return "applied"

    def evict(self, now: int) -> list[Request]:
        """The replicas are gone: drop queued optional work, hand back queued baseline work."""
        self.advance(now)
        self.now = now
        self.admission.preempt(now)
        if self.idle is not None:
            self.idle.halt()
        handed_back = []
        while self.admission.queued_items:
            for work in self.admission.next_batch(1 << 30, now):
                req, kind = work.item
                if kind == BASE:
                    handed_back.append(req)
        self.replicas = 0
        return handed_back

    # -- telemetry ---------------------------------------------------------------------------

    def record(self, latency_ms: float, baseline: bool, rows: int, optional_done: int) -> None:
        self._window.record(latency_ms, baseline, rows, optional_done)

    def answered(self, req: Request) -> None:
        """A request this replica answered, recorded as the live worker records its response:
        the rows the client sent, and the optional units done."""
        if req.powerful_done:
            self._window.record_whole(req.opt_latency, req.base, req.base + req.opt_units)
        else:
            done = req.opt_units if req.opt_done else 0
            sent = req.base + (0 if req.fell_back else req.extra)
            self.record(req.finished_ms - req.at_worker_ms, True, sent, done)

    def abandoned(self, req: Request, latency_ms: float) -> None:
        """A whole request this replica answered after ``latency_ms``, when its client had
        given up on it: the live worker still scores and reports it (its latency is what the
        SBM loop must see), and the request's settlement goes with its fallback."""
        self._window.record_whole(latency_ms, req.base, req.base + req.opt_units)

    def report(self, now: int) -> WindowReport:
        """Close the telemetry window (what the live worker publishes every interval)."""
        self.advance(now)
        if self.idle is not None:
            self.idle.measure()
        totals = LoadTotals.of(self.admission.state(now), self.rows_done,
                               self.server.busy_ms / 1000.0, self.replicas,
                               extras_room=self.admission.take_room(),
                               precompute_busy_s=None if self.idle is None
                               else self.idle.busy_total_ms / 1000.0)
        return self._window.close(now, totals)


class NormalBlock:
    """Lognormal multipliers drawn in blocks from one generator (one numpy call per 4096)."""

    def __init__(self, rng: np.random.Generator, sigma: float, block: int = 4096) -> None:
        self.rng = rng
        self.sigma = sigma
        self.block = block
        self._values: list[float] = []
        self._i = 0

    def __call__(self) -> float:
        i = self._i
        if i >= len(self._values):
            # math.exp, not np.exp: numpy's SIMD exp may differ in the last bit between CPUs,
            # and a simulation must give the same numbers everywhere
            self._values = [math.exp(x) for x in
                            self.rng.normal(0.0, self.sigma, self.block).tolist()]
            i = 0
        self._i = i + 1
        return self._values[i]
