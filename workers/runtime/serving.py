"""How a worker serves one request, by the optional work it carries.

A powerful replica (SBM) takes the whole request as one unit of optional work: its base
candidates are done or not at all, and not doing them is a 503 so the client falls back to the
baseline replicas provisioned for all traffic. A ranking replica (RMA) always scores the base
candidates and adds the extras the targets, the budget and admission allow. Either way the
request is counted in the telemetry window and the metrics, and answered with the replica's
load so clients can shed on their own.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from schemas.contract import ModelKind
from workers.api import RankResponse, ServerState
from workers.features import Rows
from workers.policy.admission import shed_priority
from workers.policy.replica import ReplicaPolicy
from workers.policy.targets import EffectiveTargets
from workers.runtime.batching import Batcher, BatcherStopped, Shed
from workers.runtime.errors import ModelFailure, NotReady, OptionalShed
from workers.runtime.metrics import WorkerMetrics
from workers.runtime.telemetry import TelemetryWindow
from workers.wire import RequestBody


class Serving:
    """The two ways a request is served, over one worker's parts (see the module docstring).

    Called on the event loop; the policy's allowance is taken under the targets lock, which a
    preemption notice on a Kafka thread also takes.

    :param model_name: the name a response reports.
    :param policy: the replica's targets and allowances.
    :param batcher: admission, the queues and the inference thread.
    :param window: the telemetry window each request is counted in.
    :param metrics: the worker's Prometheus metrics.
    :param targets_lock: guards the policy's target state.
    :param server_state: the replica's load, for each response.
    """

    def __init__(self, model_name: ModelKind, policy: ReplicaPolicy, batcher: Batcher,
                 window: TelemetryWindow, metrics: WorkerMetrics,
                 targets_lock: threading.Lock, server_state: Callable[[bool], ServerState]) -> None:
        self.model_name = model_name
        self.policy = policy
        self.batcher = batcher
        self.window = window
        self.metrics = metrics
        self._targets_lock = targets_lock
        self._server_state = server_state

    async def whole(self, req: RequestBody, rows: Rows, effective: EffectiveTargets,
                    started: float) -> RankResponse:
        """SBM: the request is one unit of optional work, its base candidates done or not at
        all; its extra candidates are trimmed to what fits (`Admission.fit_whole`).

        Not doing it raises :class:`OptionalShed` (HTTP 503), never a 200 without the baseline
        candidates' scores, so the client always falls back to the baseline pool.
        """
        n = rows.count
        reason = self.policy.whole_refusal(effective)
        if reason is not None:
            self.batcher.count_shed(reason, n)
            self.window.record(0.0, False, n, 0)
            raise OptionalShed(reason)
        base_n = min(req.base_count, n)
        allowance = self.policy.allow_whole_extra(effective, n - base_n)
        if allowance.refused is not None:
            self.batcher.count_shed(allowance.refused, n - base_n - allowance.allowed)
        kept = base_n + self.batcher.fit_whole(base_n, allowance.allowed)
        if kept < n:
            rows = rows.take(0, kept)
        try:
            scores = await self.batcher.submit_optional(rows, shed_priority(
                req.value, req.gain), req.deadline_ms)
        except Shed as shed:
            self.window.record((time.perf_counter() - started) * 1000.0, False, n, 0)
            raise OptionalShed(shed.reason) from None
        except BatcherStopped as exc:
            raise NotReady(str(exc)) from None
        except RuntimeError as exc:
            self.batcher.count_shed("model_failure", n)
            self.window.record_rejected(False)
            raise ModelFailure(str(exc)) from None
        elapsed = time.perf_counter() - started
        self.metrics.latency.labels("optional").observe(elapsed)
        self.window.record_whole(elapsed * 1000.0, base_n, kept)
        self.metrics.requests.labels("ok").inc()
        return RankResponse(
            request_id=req.request_id, model=self.model_name, scores=scores.tolist(),
            scored=kept, optional_scored=kept - base_n, optional_shed=n - kept,
            shed_reason="overload" if kept < n else None,
            server=self._server_state(req.report_room))

    async def split(self, req: RequestBody, rows: Rows, effective: EffectiveTargets,
                    started: float) -> RankResponse:
        """RMA: baseline candidates always scored; extra candidates only as allowed."""
        base_n = req.base_count
        extra_n = rows.count - base_n
        with self._targets_lock:
            allowance = self.policy.allow_extra(effective, extra_n)
        if allowance.new_budget is not None:
            self.batcher.set_budget(allowance.new_budget, allowance.banked_units)
        allowed, refusal = allowance.allowed, allowance.refused
        try:
            base_fut = self.batcher.submit_baseline(rows.take(0, base_n)) if base_n else None
            fitted = self.batcher.fit_optional(allowed)
            trimmed, allowed = allowed - fitted, fitted
            opt_fut = (self.batcher.submit_optional(rows.take(base_n, base_n + allowed),
                                                    shed_priority(req.value, req.gain),
                                                    req.deadline_ms)
                       if allowed else None)
        except BatcherStopped as exc:
            self.window.record_rejected(base_n > 0)
            raise NotReady(str(exc)) from None
        if extra_n > allowed + trimmed and refusal is not None:
            self.batcher.count_shed(refusal, extra_n - allowed - trimmed)
        if trimmed:  # the extras that did not fit under the delay bound (counted already)
            refusal = "overload"
        scores: list[float] = []
        try:
            if base_fut is not None:
                scores += (await base_fut).tolist()
                self.metrics.latency.labels("baseline").observe(time.perf_counter() - started)
        except asyncio.CancelledError:  # the caller went away; the rows are still scored
            discard(opt_fut)
            raise
        except RuntimeError as exc:
            discard(opt_fut)
            self.window.record_rejected(True)
            self.metrics.requests.labels("model_failure").inc()
            raise ModelFailure(str(exc)) from None
        optional_done, shed_reason = 0, refusal
        if opt_fut is not None:
            try:
                scores += (await opt_fut).tolist()
                optional_done = allowed
                self.metrics.latency.labels("optional").observe(time.perf_counter() - started)
            except Shed as shed:
                shed_reason = shed.reason
            except RuntimeError:
                shed_reason = "model_failure"
                self.batcher.count_shed(shed_reason, allowed)
        self.window.record((time.perf_counter() - started) * 1000.0, base_n > 0, rows.count,
                           optional_done)
        self.metrics.requests.labels("ok").inc()
        return RankResponse(
            request_id=req.request_id, model=self.model_name, scores=scores,
            scored=len(scores), optional_scored=optional_done,
            optional_shed=extra_n - optional_done,
            shed_reason=shed_reason if optional_done < extra_n else None,
            server=self._server_state(req.report_room))


def discard(fut: asyncio.Future[Any] | None) -> None:
    """Stop caring about a future without leaving an unretrieved exception behind."""
    if fut is None:
        return
    if fut.done():
        if not fut.cancelled():
            fut.exception()
    else:
        fut.cancel()
