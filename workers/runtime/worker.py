"""One inference worker: the model, the batcher, the targets it holds, and how a request is split.

Per request, the first ``base_count`` candidates are baseline work: always queued, never shed.
The rest are optional RMA extra candidates: only as many as the current targets allow (none
while targets are missing, stale or preempted), and only if admission takes them. An
opportunistic replica of the powerful model treats the whole request as optional: if it cannot
do it, the client falls back to the baseline replicas provisioned for all traffic.

This object is shared by the HTTP handlers (event loop thread), the inference thread and the
Kafka threads. Admission is guarded by the batcher's lock and the target state by its own, so a
preemption notice can stop optional work from the Kafka thread without waiting for the loop.

Its parts are modules of their own: the two ways a request is served (``serving``), the model
it serves with (``served_model``), the notices it makes and checks (``notices``) and the errors
a request can meet (``errors``). Their public names are importable from here too.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from schemas.clock import wall_ms, wall_ms_fine
from schemas.contract import ControlTargets, PreemptionNotice, WindowReport
from workers.api import RankResponse, ServerState
from workers.features import Rows
from workers.policy.admission import Admission
from workers.policy.replica import NoticeOutcome, ReplicaPolicy
from workers.policy.targets import EffectiveTargets, TargetState, TargetVerdict
from workers.runtime.batching import Batcher, BatchReport, Job, monotonic_ms
from workers.runtime.config import WorkerConfig
from workers.runtime.errors import ModelFailure, NotReady, OptionalShed, RequestError
from workers.runtime.keywatch import watch as watch_keys
from workers.runtime.metrics import Snapshot, WorkerMetrics
from workers.runtime.notices import NoticePath, notice_refusal, shutdown_notice
from workers.runtime.served_model import NotLoaded, ServedModel, device_type, load_served
from workers.runtime.serving import Serving
from workers.runtime.telemetry import Identity, LoadTotals, TelemetryWindow
from workers.wire import RequestBody, ShapeMismatch, model_rows

__all__ = ["DeadLetters", "KafkaLink", "ModelFailure", "NotReady", "NoticePath", "OptionalShed",
           "RequestError", "ServedModel", "Worker"]


class DeadLetters(Protocol):
    """Where a refused request is kept (``kafka_io.DeadLetterSink``)."""

    def send_request(self, source: str, body: bytes, reason: str) -> None: ...


class KafkaLink(Protocol):
    """What the worker needs from its Kafka I/O (see ``kafka_io.KafkaIO``)."""

    @property
    def deadletters(self) -> DeadLetters: ...

    def readiness(self) -> tuple[bool, dict[str, Any]]: ...


class Worker:
    """See the module docstring. ``start`` loads the model; ``rank`` serves one request."""

    def __init__(self, config: WorkerConfig, clock_ms: Callable[[], int] = wall_ms,
                 monotonic_ms: Callable[[], float] = monotonic_ms) -> None:
        """``clock_ms`` is the wall clock of targets and notices, ``monotonic_ms`` the batcher's
        clock of queue waits and budgets (both injectable so one recorded sequence can drive
        this worker and the simulated one alike, ``tests/conformance``)."""
        self.config = config
        self.clock_ms = clock_ms
        #: What the model takes (`workers.features`): every request is checked against it.
        self.signature = config.model.signature()
        self.model: ServedModel | None = None
        self.admission: Admission[Job] = Admission(
            config.admission, whole_requests=config.whole_request_optional,
            batch_wait_ms=config.batching.max_wait_ms)
        self.batcher = Batcher(NotLoaded(), self.admission, config.batching,
                               on_batch=self._on_batch, clock_ms=monotonic_ms)
        #: The keyring targets and notices must verify against (None: signatures off).
        self.keys = config.keys()
        self._keys_stop = threading.Event()
        self.policy = ReplicaPolicy(pool_id=config.pool, worker_id=config.worker_id,
                                    region=config.region, limits=config.limits,
                                    started_ms=clock_ms(),
                                    verifier=self.keys.check if self.keys else None,
                                    budget_share=config.budget_share)
        self._targets_lock = threading.Lock()
        self.metrics = WorkerMetrics(self.snapshot)
        self.window = TelemetryWindow(Identity(
            pool_id=config.pool, worker_id=config.worker_id, region=config.region,
            service=config.service, model=config.model.name, tier=config.tier,
            accelerator=config.accelerator), clock_ms())
        self.in_flight = 0
        self.kafka: KafkaLink | None = None
        self.draining_deadline_ms: int | None = None
        self.stopping = False
        #: Called in the Kafka thread right after optional work stopped: (notice, perf_ns).
        self.preemption_listeners: list[Callable[[PreemptionNotice, int], None]] = []
        #: Called, on whichever thread made it, when the replica starts or stops draining (a
        #: reclaim reached it, SIGTERM, or new targets resumed it): membership says so at once.
        self.drain_listeners: list[Callable[[], None]] = []
        #: The URL this replica serves at, once its port is bound (``server.serve``).
        self.endpoint: str | None = None
        self._serving = Serving(config.model.name, self.policy, self.batcher, self.window,
                                self.metrics, self._targets_lock, self.server_state)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self, model: ServedModel | None = None) -> None:
        """Load the model, or connect to the model server and check it (off the event loop),
        then start the inference thread; ``ModelLoadError`` says why it cannot serve."""
        loaded = (model if model is not None
                  else await load_served(self.config.model, self.config.accelerator,
                                         stand_in=self.config.accelerator_stand_in))
        self.admission.calibrate(getattr(loaded, "calibration", ()))
        self.batcher.size_for(device_type(loaded))
        self.batcher.scorer = loaded
        self.model = loaded
        self.batcher.start()
        if self.keys is not None and self.keys.path is not None and self.config.signing_reload_s:
            watch_keys(self.keys, self.config.signing_reload_s, self._keys_stop)

    def begin_shutdown(self) -> PreemptionNotice:
        """SIGTERM's first steps, at once: not ready (new requests are refused), then optional
        work stopped through the preemption path, by a notice for this replica alone whose
        deadline is the grace period. Returns the notice, for the control plane's fast path
        to drop this replica's share. Baseline work in flight carries on (``stop``)."""
        self.stopping = True
        now = self.clock_ms()
        notice = shutdown_notice(self.config, self.policy.shutdown_notice_id(now), now,
                                 self.keys)
        self._stop_optional(notice)  # not a reclaim reaction: kept out of its metrics
        self._drain_changed()
        return notice

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Refuse new work, serve what is queued (baseline only once optional work stopped),
        stop the inference thread; waits at most ``timeout_s``."""
        self.stopping = True
        self._keys_stop.set()
        await asyncio.to_thread(self.batcher.stop, timeout_s)
        close = getattr(self.model, "close", None)  # a model server's pooled connections
        if close is not None and not self.batcher.running:
            close()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready once the model serves and targets were read (or we gave up waiting)."""
        detail: dict[str, Any] = {"model": self.model.source if self.model else "loading",
                                  "worker_id": self.config.worker_id, "pool_id": self.config.pool}
        ready = self.model is not None and self.batcher.running and not self.stopping
        if self.draining_deadline_ms is not None:
            detail["draining_until_ms"] = self.draining_deadline_ms
            ready = False
        if self.kafka is not None:
            kafka_ready, kafka_detail = self.kafka.readiness()
            detail["kafka"] = kafka_detail
            ready = ready and kafka_ready
        return ready, detail

    # -- requests --------------------------------------------------------------------------------

    async def rank(self, req: RequestBody) -> RankResponse:
        """Score the request's baseline candidates, and the optional ones that are allowed
        (the request decoded from JSON or msgpack: `workers.wire`)."""
        if self.model is None or not self.batcher.running or self.stopping:
            raise NotReady("the model is still loading" if self.model is None
                           else "the worker is shutting down")
        rows = self._rows(req)
        started = time.perf_counter()
        effective = self.current_targets()
        self.in_flight += 1
        try:
            if self.config.whole_request_optional:
                return await self._serving.whole(req, rows, effective, started)
            return await self._serving.split(req, rows, effective, started)
        finally:
            self.in_flight -= 1

    def _rows(self, req: RequestBody) -> Rows:
        """The request's rows as the model's spec takes them (`workers.wire.model_rows`);
        RequestError names a bad field."""
        try:
            return model_rows(req, self.signature, self.config.model.name)
        except ShapeMismatch as exc:
            raise RequestError(str(exc)) from None

    def server_state(self, report_room: bool = False) -> ServerState:
        """The load signals a response carries; its room for extras only when asked."""
        state = self.batcher.state()
        return ServerState(queue_delay_ms=max(0.0, state.queue_delay_ms), in_flight=self.in_flight,
                           shedding_level=state.shedding_level,
                           preempted=(state.preempted or self.targets.preempted
                                      or self.policy.reclaimed(self.clock_ms())),
                           optional_room=state.optional_room if report_room else None)

    # -- control (any thread) --------------------------------------------------------------------

    @property
    def targets(self) -> TargetState:
        return self.policy.targets

    def current_targets(self) -> EffectiveTargets:
        """What this replica may do now (`ReplicaPolicy.current`: baseline only from the
        deadline of a reclaim that reached it, whatever targets say)."""
        with self._targets_lock:
            return self.policy.current(self.clock_ms())

    def offer_targets(self, targets: ControlTargets) -> TargetVerdict:
        """Apply targets read from Kafka; new targets after a preemption resume optional work."""
        with self._targets_lock:
            verdict, resume = self.policy.offer(targets, self.clock_ms(),
                                                admission_preempted=self.admission.preempted)
        if resume:
            self.batcher.resume()
            self.draining_deadline_ms = None
            self._drain_changed()
        return verdict

    def notice_refusal(self, notice: PreemptionNotice, *, path: NoticePath = "kafka",
                       headers: Mapping[str, str] | None = None, body: bytes = b"") -> str | None:
        """Why a notice must not be acted on for its signature, counted under its path; None
        when signatures are off or it verifies. A notice only stops optional work, but a
        forged one could stop it on every replica at once. By ``POST /v1/preempt`` the
        request's own headers must sign its body within ``notice_request_window_s`` (a
        recorded request replayed later is refused) and the notice its issuer's signature."""
        refusal = notice_refusal(self.keys, notice, path, headers, body, self.clock_ms,
                                 int(self.config.notice_request_window_s * 1000))
        if refusal is not None:
            self.metrics.notices.labels(path, refusal).inc()
        return refusal

    def on_preemption(self, notice: PreemptionNotice, *, path: NoticePath = "kafka",
                      read_ms: float | None = None) -> NoticeOutcome:
        """Stop optional work now if the notice is for this replica; returns the outcome.

        A notice may come by two paths, Kafka and ``POST /v1/preempt`` from the platform beside
        the replica; the first applies and is measured, the other is a ``duplicate``.
        ``read_ms`` (wall clock) is when the path handed it over: its delivery time."""
        outcome = self._stop_optional(notice)
        self.metrics.notices.labels(path, outcome).inc()
        if outcome != "applied":
            return outcome
        stopped_ns = time.perf_counter_ns()
        reaction_ms = wall_ms_fine() - notice.ts_ms
        self.metrics.preemption_reaction.observe(max(0.0, reaction_ms) / 1000.0)
        if read_ms is not None:
            self.metrics.preemption_delivery.observe(max(0.0, read_ms - notice.ts_ms) / 1000.0)
        self.metrics.preemptions.inc()
        for listener in self.preemption_listeners:
            listener(notice, stopped_ns)
        self._drain_changed()  # after the reaction is measured: optional work stopped first
        return "applied"

    def _stop_optional(self, notice: PreemptionNotice) -> NoticeOutcome:
        with self._targets_lock:
            outcome = self.policy.on_notice(notice, self.clock_ms())
        if outcome == "applied":
            self.batcher.preempt()
            self.draining_deadline_ms = notice.deadline_ms
        return outcome

    @property
    def draining(self) -> bool:
        """Being reclaimed or stopping: clients must stop routing here (membership)."""
        return self.stopping or self.draining_deadline_ms is not None

    def _drain_changed(self) -> None:
        for listener in self.drain_listeners:
            listener()

    # -- observation -----------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        with self._targets_lock:
            now_ms = self.clock_ms()
            effective = self.policy.current(now_ms)
            verdicts = dict(self.targets.counters)
            age_ms = self.targets.age_ms(now_ms)
        return Snapshot(self.batcher.state(), effective, verdicts, self.in_flight,
                        targets_age_ms=age_ms)

    def load_totals(self) -> LoadTotals:
        return LoadTotals.of(self.batcher.state(), self.batcher.rows_done, self.batcher.busy_s,
                             extras_room=self.batcher.take_room(),
                             precompute_busy_s=self.batcher.idle_quota_s)

    def window_report(self) -> WindowReport:
        """Close the telemetry window and return its report."""
        return self.window.close(self.clock_ms(), self.load_totals())

    def _on_batch(self, report: BatchReport) -> None:
        m = self.metrics
        m.batch_rows.observe(report.rows)
        m.forward.observe(report.forward_s)
        for optional, wait_ms in report.queue_wait_ms:
            m.queue_wait.labels("optional" if optional else "baseline").observe(
                max(0.0, wait_ms) / 1000.0)
