"""Dynamic batching: candidate rows of many requests go through one forward pass together.

A per-row forward pass wastes most of an accelerator (or CPU core) on per-call overhead, so the
batcher collects rows from concurrent requests until ``max_batch_rows`` is reached or the oldest
queued row has waited ``max_wait_ms`` (the cap, unless configured, is the device's:
`DEFAULT_BATCH_ROWS`), runs one forward pass in a dedicated inference thread
(never on the asyncio event loop), and scatters the scores back to each request's future.

What goes into a batch is decided by :class:`workers.policy.admission.Admission`: baseline rows
first, optional rows only behind all queued baseline rows, and optional rows shed by value under
overload, deadline, preemption or budget. Optional answers of a batch that was in service
when a preemption notice came are discarded and counted (``Admission.usable``), whichever
backend scored it: the rule sits here once, so a remote model server's round trip cannot let
optional work outlive a notice. The admission object is guarded by one lock that is
held only for queue operations, never during a forward pass, so the event loop and the Kafka
preemption thread are never blocked behind the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

import msgspec
import numpy as np
from msgspec import Meta

from schemas.contract import ShedReason
from workers.features import Rows, assemble
from workers.policy.admission import Admission, AdmissionState, Admitted

#: The batch cap where the config sets none, by the device the model runs on. A GPU at 512 rows
#: a pass scored no more rows/s than 16 CPU cores (the cap, not the device, bound); at 8,192 an
#: H200 scored 4.7x (baseline) and 5.5x (powerful) that CPU's rows with p99 under 50 ms
#: (docs/benchmarks.md). On the CPU 8,192 doubled the p99 (26.5 against 13.5 ms at 256
#: candidates a request), so 512 stays there.
DEFAULT_BATCH_ROWS = {"cpu": 512, "cuda": 8192}


class BatchingConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How big a forward pass may get and how long the first row may wait for company."""

    #: None: the device's default (`DEFAULT_BATCH_ROWS`; a model server's, the CPU's).
    max_batch_rows: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None
    max_wait_ms: Annotated[float, Meta(ge=0.0, le=1000.0)] = 2.0


def batch_rows(config: BatchingConfig, device: str) -> int:
    """The rows a pass may take: the configured cap, or the default of ``device`` (``cpu``,
    ``cuda``; another is taken as the CPU)."""
    if config.max_batch_rows is not None:
        return config.max_batch_rows
    return DEFAULT_BATCH_ROWS.get(device, DEFAULT_BATCH_ROWS["cpu"])


class Scorer(Protocol):
    """Anything that scores rows: ``LoadedModel`` (in-process torch) or ``OipModel`` (a model
    server over the Open Inference Protocol) in production, a fake in pure tests. Called from
    the inference thread only, one batch at a time, with the model's arguments in its
    signature's order (`workers.features.assemble`: ``dense, sparse`` unless the model
    declares its inputs)."""

    def score(self, *inputs: np.ndarray) -> np.ndarray: ...


class Shed(Exception):
    """Optional work that was not done; ``reason`` is the counter key it was counted under."""

    def __init__(self, reason: ShedReason) -> None:
        super().__init__(reason)
        self.reason = reason


class BatcherStopped(RuntimeError):
    """Work submitted after the batcher stopped."""


@dataclass(slots=True)
class Job:
    """Rows of one request that travel together (its request-dense vectors broadcast over
    them when batched)."""

    rows: Rows
    future: asyncio.Future[np.ndarray]
    loop: asyncio.AbstractEventLoop


@dataclass(frozen=True, slots=True)
class BatchReport:
    """One forward pass, for metrics and telemetry."""

    rows: int
    optional_rows: int
    jobs: int
    forward_s: float
    queue_wait_ms: list[tuple[bool, float]] = field(default_factory=list)  # (optional, ms)
    error: str | None = None
    #: Optional rows scored but not used: a preemption notice came while they were in service.
    discarded_optional_rows: int = 0


def monotonic_ms() -> float:
    return time.monotonic() * 1000.0


class IdleWork(Protocol):
    """Work the inference thread does only when no request is queued (the precompute lever,
    `workers.runtime.precompute`): one short slice a call, so a request that arrives waits
    for one slice at most."""

    def ready_in(self) -> float | None:
        """Seconds until the next slice may run (0: now), None while there is none to do."""

    def step(self, scorer: Scorer) -> None: ...

    def halt(self) -> None:
        """A notice: drop what is held, answer nothing scored across it."""

    @property
    def quota_s(self) -> float:
        """Seconds of the replica's CPU quota its slices took since it started: their time
        over the quota's cores (one without a quota), so that a slice at its ``max_share``
        reads that share in telemetry (``WindowReport.precompute_utilisation``)."""


#: How often an idle inference thread looks for idle work that came with no wake-up.
IDLE_POLL_S = 0.05


class Batcher:
    """Owns the admission queues and the inference thread; see the module docstring."""

    def __init__(self, scorer: Scorer, admission: Admission[Job], config: BatchingConfig,
                 on_batch: Callable[[BatchReport], None] | None = None,
                 clock_ms: Callable[[], float] = monotonic_ms) -> None:
        self.scorer = scorer
        self.admission = admission
        self.config = config
        self._on_batch = on_batch
        self._clock_ms = clock_ms
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: Done between requests, never before one (`set_idle_work`).
        self._idle_work: IdleWork | None = None
        admission.on_shed = self._shed  # dropped from the queue -> answer its waiter
        #: Rows a forward pass may take: the CPU's cap until `size_for` knows the device.
        self.max_batch_rows = batch_rows(config, "cpu")
        admission.batch_units = self.max_batch_rows
        # Totals since start, read by telemetry as differences between windows.
        self.rows_done = 0
        self.optional_rows_done = 0
        self.busy_s = 0.0
        self.batches = 0
        #: Optional rows scored but not used: in service when a notice came (also counted in
        #: admission's shed units as ``preemption``, with the queued ones a notice dropped).
        self.optional_rows_discarded = 0

    # -- lifecycle -------------------------------------------------------------------------------

    def size_for(self, device: str) -> int:
        """Cap passes at ``device``'s default (`batch_rows`) once the model is loaded and its
        device known; a configured cap stays. Admission predicts drain time in passes of it."""
        with self._cond:
            self.max_batch_rows = batch_rows(self.config, device)
            self.admission.batch_units = self.max_batch_rows
        return self.max_batch_rows

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="surplus-inference", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Serve what is queued, then end the inference thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def set_idle_work(self, work: IdleWork | None) -> None:
        with self._cond:
            self._idle_work = work
            self._cond.notify()

    @property
    def idle_quota_s(self) -> float | None:
        """Quota-seconds the idle work's slices took since it started (``IdleWork.quota_s``);
        None without idle work."""
        work = self._idle_work
        return None if work is None else work.quota_s

    def wake(self) -> None:
        """Idle work arrived: an idle inference thread looks at once."""
        with self._cond:
            self._cond.notify()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- submission (event loop thread) ----------------------------------------------------------

    def submit_baseline(self, rows: Rows) -> asyncio.Future[np.ndarray]:
        """Queue baseline rows; never refused. The future yields their scores."""
        job = self._job(rows)
        with self._cond:
            if self._stopping:
                raise BatcherStopped("the worker is shutting down")
            self.admission.admit_baseline(job, self._now(), units=rows.count)
            self._cond.notify()
        return job.future

    def submit_optional(self, rows: Rows, value: float,
                        deadline_ms: float) -> asyncio.Future[np.ndarray]:
        """Queue optional rows due within ``deadline_ms`` from now; the future raises
        :class:`Shed` if they are refused now or dropped later."""
        job = self._job(rows)
        with self._cond:
            now = self._now()
            admitted = not self._stopping and self.admission.admit_optional(
                job, value, now + max(1, int(deadline_ms)), now, units=rows.count)
            reason: ShedReason | None = (self.admission.last_refusal if not self._stopping
                                         else "shutdown")
            if admitted:
                self._cond.notify()
        if not admitted:
            if self._stopping:
                self.admission.count_shed("shutdown", rows.count)
            job.future.set_exception(Shed(reason or "overload"))
        return job.future

    def _job(self, rows: Rows) -> Job:
        loop = asyncio.get_running_loop()
        return Job(rows, loop.create_future(), loop)

    # -- control (any thread) --------------------------------------------------------------------

    def preempt(self) -> int:
        """Drop all queued optional work and refuse more, now, idle work too; returns the
        jobs dropped."""
        with self._cond:
            if self._idle_work is not None:
                self._idle_work.halt()
            return self.admission.preempt(self._now())

    def resume(self) -> None:
        with self._cond:
            self.admission.resume()

    def set_budget(self, units_per_s: float | None, floor_units: float = 0.0) -> None:
        with self._cond:
            self.admission.set_budget(units_per_s, self._now(), floor_units)

    def fit_optional(self, units: int) -> int:
        """Of `units` divisible optional units, those that fit under admission's delay bound
        now; the rest are counted as shed (`Admission.fit_optional`)."""
        with self._cond:
            return self.admission.fit_optional(units)

    def fit_whole(self, base: int, extra: int) -> int:
        """Of a whole request's `extra` candidates, those to serve with its `base` ones
        (`Admission.fit_whole`)."""
        with self._cond:
            return self.admission.fit_whole(base, extra)

    def take_room(self) -> int | None:
        """The most extras one request could have kept since the last call
        (`Admission.take_room`)."""
        with self._cond:
            return self.admission.take_room()

    def count_shed(self, reason: ShedReason, units: int) -> None:
        with self._cond:
            self.admission.count_shed(reason, units)

    def state(self) -> AdmissionState:
        with self._cond:
            return self.admission.state(self._now())

    def _now(self) -> int:
        return int(self._clock_ms())

    # -- inference thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                batch = self._collect()
                preemptions = self.admission.preemptions
                idle = self._idle_work
            if batch is None:
                return
            if batch is _IDLE and idle is not None:
                idle.step(self.scorer)
                continue
            self._forward(batch, preemptions)

    def _collect(self) -> list[Admitted[Job]] | None:
        """Wait for work, then for company up to ``max_wait_ms`` after the oldest row queued;
        `_IDLE` when nothing is queued and there is idle work to do."""
        adm, cfg = self.admission, self.config
        while not adm.queued_items:
            if self._stopping:
                return None
            wait: float | None = None
            if self._idle_work is not None:
                ready_in = self._idle_work.ready_in()
                if ready_in is not None and ready_in <= 0.0:
                    return _IDLE
                wait = IDLE_POLL_S if ready_in is None else min(ready_in, IDLE_POLL_S)
            self._cond.wait(wait)
        while not self._stopping and adm.queued_units < self.max_batch_rows:
            oldest = adm.oldest_enqueued_ms()
            if oldest is None:
                break
            remaining_ms = oldest + cfg.max_wait_ms - self._clock_ms()
            if remaining_ms <= 0:
                break
            self._cond.wait(remaining_ms / 1000.0)
        return adm.next_batch(self.max_batch_rows, self._now())

    def _forward(self, batch: list[Admitted[Job]], preemptions: int) -> None:
        """One forward pass; ``preemptions`` is admission's count of notices when the batch
        was taken, so the optional answers of a pass that ran across a notice are dropped."""
        if not batch:  # everything queued expired or was shed while we waited
            return
        started_ms = self._clock_ms()
        waits = [(w.optional, started_ms - w.enqueued_ms) for w in batch]
        jobs = [w.item for w in batch]
        t0 = time.perf_counter()
        error: str | None = None
        try:
            scores = self.scorer.score(*assemble([j.rows for j in jobs]))
        except Exception as exc:  # a broken user model fails its batch, not the worker
            error = f"model failed: {type(exc).__name__}: {exc}"
        elapsed = time.perf_counter() - t0
        rows = sum(w.units for w in batch)
        optional_rows = sum(w.units for w in batch if w.optional)
        with self._cond:
            self.admission.record_service(rows, elapsed * 1000.0)
            # Discarded rows stay in the totals: the backend did them, and the measured cost
            # per unit is what a unit of work takes, used or not.
            self.rows_done += rows
            self.optional_rows_done += optional_rows
            self.busy_s += elapsed
            self.batches += 1
            usable = self.admission.usable(batch, preemptions)
            discarded = sum(w.units for w, use in zip(batch, usable, strict=True) if not use)
            self.optional_rows_discarded += discarded
        self._scatter(jobs, usable, None if error else scores, error)
        if self._on_batch is not None:
            self._on_batch(BatchReport(rows, optional_rows, len(jobs), elapsed, waits, error,
                                       discarded))

    def _scatter(self, jobs: list[Job], usable: list[bool], scores: np.ndarray | None,
                 error: str | None) -> None:
        """Hand each job its slice of the scores (or :class:`Shed` where its answer may not
        be used), one loop callback per loop per batch."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, Any]]] = {}
        start = 0
        for job, use in zip(jobs, usable, strict=True):
            n = job.rows.count
            result: Any = (Shed("preemption") if not use
                           else RuntimeError(error) if scores is None else scores[start:start + n])
            by_loop.setdefault(job.loop, []).append((job, result))
            start += n
        for loop, results in by_loop.items():
            _call_in_loop(loop, _settle, results)

    def _shed(self, job: Job, reason: ShedReason) -> None:
        _call_in_loop(job.loop, _settle, [(job, Shed(reason))])


#: `_collect`'s answer when the queue is empty and idle work waits (compared by identity).
_IDLE: list[Admitted[Job]] = []


def _settle(results: list[tuple[Job, Any]]) -> None:
    for job, result in results:
        if job.future.done():  # the caller went away
            continue
        if isinstance(result, BaseException):
            job.future.set_exception(result)
        else:
            job.future.set_result(result)


def _call_in_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
        loop.call_soon_threadsafe(fn, *args)
