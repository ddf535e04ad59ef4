"""The two replicas a case runs on, behind one interface: the live worker (in process, with its
real batcher and a tiny torch model) and the simulated worker of the fleet simulator.

Both read one fake clock. Each answer is plain data so the test can compare them whole:
the verdict on a targets message, the outcome of a notice, the optional units a request got
done with the units shed for it by reason, and a report's fields. Fields measured in time
(latency sketch, utilisation, capacity estimate, queue delay, busy time, and the room one
request had, which the service time sets) differ by nature and are left out.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Protocol

import msgspec

from schemas.contract import CapacityEvent, ControlTargets, PreemptionNotice, WindowReport
from sim.scenario import CapacityConfig, PoolConfig
from sim.worker import OPT, WHOLE, Request, SimWorker
from tests.conformance.cases import REGION, WORKER, Case, Rank
from tests.integration.worker_support import rank_request, tiny_config
from workers.runtime.models import load_model
from workers.runtime.worker import OptionalShed, Worker

TIMED_FIELDS = (
    "latency_ms", "utilisation", "capacity_rps", "queue_delay_ms", "busy_s", "extras_room")
DEADLINE_MS = 5_000.0


class Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def report_fields(report: WindowReport) -> dict[str, Any]:
    fields = msgspec.structs.asdict(report)
    for name in TIMED_FIELDS:
        fields.pop(name)
    return fields


def shed_growth(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {r: n - before.get(r, 0) for r, n in sorted(after.items()) if n != before.get(r, 0)}


class Side(Protocol):
    pool_id: str

    async def offer(self, targets: ControlTargets) -> str: ...
    async def notice(self, notice: PreemptionNotice) -> str: ...
    async def capacity(self, event: CapacityEvent) -> None: ...
    async def rank(self, step: Rank) -> dict[str, Any]: ...
    async def report(self) -> dict[str, Any]: ...


def admission_overrides(case: Case) -> dict[str, Any]:
    """The case's service model and delay bound as worker config keys, for both sides."""
    keys = {"admission.initial_ms_per_unit": case.ms_per_unit,
            "admission.max_queue_delay_ms": case.max_queue_delay_ms}
    return {k: v for k, v in keys.items() if v is not None}


class LiveSide:
    """``workers.runtime.worker.Worker``: the HTTP handler's code path, minus the HTTP."""

    def __init__(self, case: Case, clock: Clock) -> None:
        model = case.model
        self.config = tiny_config(**{
            "worker_id": WORKER, "region": REGION, "accelerator": "cpu",
            "tier": "opportunistic" if model == "powerful" else "baseline",
            "model.name": model, "budget_share": case.budget_share,
            "batching.max_wait_ms": 0.0, **admission_overrides(case)})
        self.pool_id = self.config.pool
        self.worker = Worker(self.config, clock_ms=clock, monotonic_ms=clock)
        self._ids = itertools.count()

    async def start(self) -> None:
        # The case pins the service model (``ms_per_unit``) on both sides: the live model's
        # timed warm-up passes, which a served worker is admitted on first, are left out.
        model = await asyncio.to_thread(load_model, self.config.model)
        model.calibration = ()
        await self.worker.start(model)

    async def stop(self) -> None:
        await self.worker.stop()

    async def offer(self, targets: ControlTargets) -> str:
        return self.worker.offer_targets(targets).reason

    async def notice(self, notice: PreemptionNotice) -> str:
        return self.worker.on_preemption(notice)

    async def capacity(self, event: CapacityEvent) -> None:
        """The worker's Kafka link reads targets and notices only: nothing to hand it."""

    async def rank(self, step: Rank) -> dict[str, Any]:
        req = rank_request(step.base, step.extra, request_id=f"r{next(self._ids)}",
                           value=step.value, deadline_ms=DEADLINE_MS)
        before = dict(self.worker.admission.shed_units)
        try:
            response = await self.worker.rank(req)
            done = (response.scored if self.config.whole_request_optional
                    else response.optional_scored)
        except OptionalShed:
            done = 0
        return {"optional_done": done,
                "shed": shed_growth(before, self.worker.admission.shed_units)}

    async def report(self) -> dict[str, Any]:
        return report_fields(self.worker.window_report())


class SimSide:
    """``sim.worker.SimWorker``: what the fleet simulator runs for each replica set."""

    def __init__(self, case: Case, clock: Clock) -> None:
        powerful = case.model == "powerful"
        self.pool = PoolConfig(
            model="powerful" if powerful else "baseline",
            tier="opportunistic" if powerful else "baseline", accelerator="cpu",
            replicas=0 if powerful else 1, capacity=CapacityConfig() if powerful else None,
            units_per_s=1000.0 / case.ms_per_unit if case.ms_per_unit else 1e6,
            inflight_ms=1_000.0, latency_sigma=0.0)
        self.pool_id = self.pool.pool_id(REGION)
        self.clock = clock
        live = tiny_config(worker_id=WORKER, **admission_overrides(case))
        self.worker = SimWorker(self.pool, REGION, WORKER, 1, admission=live.admission,
                                limits=live.limits, start_ms=clock(), noise=lambda: 1.0,
                                on_done=self._done, on_shed=lambda *_: None)
        self.worker.budget_share = case.budget_share
        self._ids = itertools.count()

    @staticmethod
    def _done(req: Request, kind: int, latency: float) -> None:
        if kind == OPT:
            req.opt_done, req.opt_pending, req.opt_latency = True, False, latency
        elif kind == WHOLE:
            req.powerful_done, req.opt_latency = True, latency

    async def offer(self, targets: ControlTargets) -> str:
        return self.worker.offer_targets(targets, self.clock()).reason

    async def notice(self, notice: PreemptionNotice) -> str:
        return self.worker.preempt(notice, self.clock())

    async def capacity(self, event: CapacityEvent) -> None:
        """Capacity reaches the simulated fleet through the schedule, never a replica."""

    async def rank(self, step: Rank) -> dict[str, Any]:
        now = self.clock()
        req = Request(next(self._ids), now, 0, step.value, step.base, step.extra)
        before = dict(self.worker.admission.shed_units)
        if self.pool.model == "powerful":
            served = self.worker.submit_whole(req, now, DEADLINE_MS)
            done = req.base + req.opt_units if served and req.powerful_done else 0
        else:
            self.worker.submit_ranking(req, now, DEADLINE_MS)
            done = req.opt_units if req.opt_done else 0
        if req.powerful_done or self.pool.model != "powerful":
            req.finished_ms = float(now)
            self.worker.answered(req)
        return {"optional_done": done,
                "shed": shed_growth(before, self.worker.admission.shed_units)}

    async def report(self) -> dict[str, Any]:
        return report_fields(self.worker.report(self.clock()))
