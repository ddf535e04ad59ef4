"""The precompute lever on a lent replica: jobs from Kafka, scored in the model's idle time.

`PrecomputeRunner` is a consumer thread in the group of its region's lent replicas of one model
(`group_id`), and the batcher's idle work (`IdleWork`): the inference thread scores a slice
of a job only when no request is queued, so requests never wait behind more than one slice.
An answer goes to the compacted cache topic under the job's key, and its offset is committed
only once the broker has it (`OffsetLedger`), so a job is never lost:

- a notice (or targets that say baseline only) stops precompute at once: the jobs held are
  dropped unanswered, an answer scored across the notice is not sent, and the consumer leaves
  the group, so another replica takes its partitions from the last commit and scores them;
- a job scored twice (a replica reclaimed after its answer was sent, before the commit) gives
  the same answer under the same key (`top_k` is deterministic), so readers count it once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from schemas import kafka_clients
from schemas.clock import wall_ms, wall_ms_fine
from schemas.codec import ContractError, codec_for, encode
from schemas.contract import PreemptionNotice
from schemas.kafka_clients import Consumer, KafkaError, Message, TopicPartition
from schemas.precompute import PrecomputeJob, PrecomputeResult, group_id
from workers.capacity.observe import own_quota
from workers.features import Rows, assemble
from workers.policy.precompute import OffsetLedger, Pace, chunk_rows, may_precompute, top_k
from workers.runtime.batching import Scorer
from workers.wire import ShapeMismatch, decode_rank_request, model_rows

if TYPE_CHECKING:
    from workers.runtime.kafka_io import KafkaIO

log = logging.getLogger("surplus.worker.precompute")
#: How often the thread re-reads whether precompute may run (a notice stops it at once anyway).
CHECK_EVERY_S = 0.05
_job_codec = codec_for(PrecomputeJob)


@dataclass
class Held:
    """A job read and not yet answered: its place in the log, its rows, what is scored."""

    partition: int
    offset: int
    job: PrecomputeJob
    rows: Rows
    ids: np.ndarray
    generation: int
    scores: list[np.ndarray] = field(default_factory=list)
    done_rows: int = 0


class PrecomputeRunner(threading.Thread):
    """See the module docstring. Started by `KafkaIO` when ``precompute.enabled``."""

    def __init__(self, io: KafkaIO) -> None:
        super().__init__(name="surplus-kafka-precompute", daemon=True)
        self.io = io
        self.worker = io.worker
        self.config = io.worker.config.precompute
        self.topic = io.settings.topic("precompute")
        self.cache_topic = io.settings.topic("cache")
        self.group = group_id(io.settings.prefix, self.worker.config.region,
                              self.worker.config.model.name)
        self._lock = threading.Lock()
        self._ready: deque[Held] = deque()
        self._current: Held | None = None
        self._ledger = OffsetLedger()
        #: Bumped by every halt: a slice scored across one is not answered.
        self._generation = 0
        self._allowed = False
        self._stop_event = threading.Event()
        self._consumer: Consumer | None = None
        self._paused = False
        #: The partitions of the jobs topic this replica holds now.
        self.partitions: list[int] = []
        self.counts: dict[str, int] = {}
        self.busy_s = 0.0
        self.rows_done = 0
        quota = own_quota()
        #: The slice it may fill: ``max_share`` of the replica's CPU quota (one core with
        #: none), with the process's own measured use fed back (`Pace`).
        self._pace = Pace(quota.cores if quota is not None else 1.0, self.config.max_share)
        self._cpu_seen = (time.monotonic(), time.process_time())
        #: A slice is in service on the inference thread (it runs on past a notice).
        self._in_slice = False
        #: Notices (their ``ts_ms``) that came during the slice in service: stopped at its end.
        self._owed: list[int] = []
        self.worker.preemption_listeners.append(self.on_notice)

    # -- the batcher's idle work (inference thread) ---------------------------------------------

    @property
    def quota_s(self) -> float:
        """Seconds of the replica's CPU quota its slices took (`IdleWork.quota_s`)."""
        return self.busy_s / self._pace.cores

    def ready_in(self) -> float | None:
        """Cheap and lock-light: called under the batcher's lock between requests."""
        if not self._allowed or (self._current is None and not self._ready):
            return None
        return self._pace.ready_in(time.monotonic())

    def step(self, scorer: Scorer) -> None:
        """Score one slice of the job in hand; answer it once its last slice is scored."""
        with self._lock:
            if self._current is None and self._ready:
                self._current = self._ready.popleft()
            held = self._current
            if held is None or not self._allowed:
                return
        cost = self.worker.admission.service.per_unit_ms
        n = chunk_rows(cost, self.config.chunk_ms, self.worker.batcher.max_batch_rows)
        chunk = held.rows.take(held.done_rows, held.done_rows + n)
        t0 = time.perf_counter()
        self._in_slice = True
        try:
            scores = np.asarray(scorer.score(*assemble([chunk]))).reshape(-1)
        except Exception as exc:  # a broken model fails the job, not the worker
            self._slice_ended()
            self._finish(held, "model_failure", str(exc))
            return
        self._slice_ended()
        elapsed = time.perf_counter() - t0
        self._pace.after(elapsed, time.monotonic())
        self.worker.metrics.precompute_busy.inc(elapsed)
        self.worker.metrics.precompute_rows.inc(chunk.count)
        with self._lock:
            self.busy_s += elapsed
            self.rows_done += chunk.count
            if held.generation != self._generation or self._current is not held:
                return  # a notice came while it was in service: not answered
            held.scores.append(scores)
            held.done_rows += chunk.count
            if held.done_rows < held.rows.count:
                return
            self._current = None
        self._answer(held)

    def on_notice(self, notice: PreemptionNotice, _stopped_ns: int) -> None:
        """A notice was applied (`Worker.on_preemption`, after `halt`): precompute stopped
        then, or stops at the end of the slice in service (`step` measures it there). The
        measure is the notice-to-shed of RMA's extras, for this lever's work."""
        with self._lock:
            if self._in_slice:
                self._owed.append(notice.ts_ms)
                return
        self._stopped(notice.ts_ms)

    def _slice_ended(self) -> None:
        with self._lock:
            self._in_slice = False
            owed, self._owed = self._owed, []
        for ts_ms in owed:
            self._stopped(ts_ms)

    def _stopped(self, ts_ms: int) -> None:
        self.worker.metrics.precompute_stop.observe(max(0.0, wall_ms_fine() - ts_ms) / 1000.0)

    def halt(self) -> None:
        """Stop now (a notice, from whichever thread read it): drop what is held unanswered;
        the thread leaves the group on its next turn, so another replica reads them again."""
        with self._lock:
            self._allowed = False
            self._generation += 1
            self._ready.clear()
            self._current = None

    # -- answers ---------------------------------------------------------------------------------

    def _answer(self, held: Held) -> None:
        job = held.job
        ids, scores = top_k(held.ids.tolist(), np.concatenate(held.scores).tolist(), job.top)
        cfg = self.worker.config
        result = PrecomputeResult(
            job_key=job.job_key, scope=job.scope, segment=job.segment, model=job.model,
            pool_id=cfg.pool, worker_id=cfg.worker_id, issued_at_ms=job.issued_at_ms,
            computed_at_ms=wall_ms(), expires_at_ms=job.expires_at_ms,
            candidates=held.rows.count, top_ids=ids, top_scores=scores)

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:  # not on the broker: score it again rather than lose it
                self._count("undelivered")
                with self._lock:
                    if held.generation == self._generation:
                        held.scores, held.done_rows = [], 0
                        self._ready.append(held)
                return
            self._finish(held, "answered")

        with self._lock:
            if held.generation != self._generation:
                return  # halted since its last slice: not answered
        try:
            self.io.producer.produce(self.cache_topic, key=job.job_key.encode(),
                                     value=encode(result), on_delivery=delivered)
        except BufferError:
            delivered(KafkaError(KafkaError._QUEUE_FULL), None)  # type: ignore[arg-type]

    def _finish(self, held: Held, outcome: str, why: str = "") -> None:
        with self._lock:
            self._ledger.done(held.partition, held.offset)
        self._count(outcome)
        if why:
            log.warning("precompute job %s: %s: %s", held.job.job_key, outcome, why)

    def _count(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] = self.counts.get(outcome, 0) + 1
        self.worker.metrics.precompute_jobs.labels(outcome).inc()

    # -- the consumer thread --------------------------------------------------------------------

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        try:
            while not self._stop_event.is_set():
                if self._refresh_allowed():
                    self._turn()
                else:
                    self._leave()
                    self._stop_event.wait(CHECK_EVERY_S)
        finally:
            self._leave()

    def _refresh_allowed(self) -> bool:
        effective = self.worker.current_targets()
        allowed = may_precompute(self.worker.config.tier, effective)
        with self._lock:
            self._pace.allow(effective.precompute_share)
            if allowed and not self._allowed:
                self._allowed = True
            elif not allowed and self._allowed:
                self._allowed = False
                self._generation += 1
                self._ready.clear()
                self._current = None
            return self._allowed

    def _measure(self) -> None:
        """The process's CPU seconds per second (every thread) over the last half second or
        more, fed to the pace."""
        now, cpu = time.monotonic(), time.process_time()
        then, before = self._cpu_seen
        if now - then < 0.5:
            return
        self._pace.update(max(0.0, cpu - before) / (now - then))
        self._cpu_seen = (now, cpu)

    def _turn(self) -> None:
        self._measure()
        consumer = self._join()
        self._commit(consumer, asynchronous=True)
        self.io.producer.poll(0)
        with self._lock:
            full = len(self._ready) >= self.config.read_ahead
        self._pause(consumer, full)
        msg = consumer.poll(CHECK_EVERY_S)
        if msg is None:
            return
        error = msg.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("precompute consumer: %s", error)
            return
        self._take(msg)

    def _take(self, msg: Message) -> None:
        partition, offset = msg.partition() or 0, msg.offset() or 0
        with self._lock:
            self._ledger.take(partition, offset)
            generation = self._generation
        try:
            job = _job_codec.decode(msg.value() or b"")
            skip = self._skip_reason(job)  # before the body: every group reads every job
            if skip is None:
                request = decode_rank_request(job.body, "msgpack")
                rows = model_rows(request, self.worker.signature, self.worker.config.model.name)
        except (ContractError, ShapeMismatch) as exc:
            self.io.deadletters.send(msg, str(exc))
            skip = "refused"
        if skip is not None:
            with self._lock:
                self._ledger.done(partition, offset)
            self._count(skip)
            return
        held = Held(partition, offset, job, rows, _candidate_ids(request, rows.count),
                    generation)
        with self._lock:
            if generation == self._generation:
                self._ready.append(held)
        self.worker.batcher.wake()

    def _skip_reason(self, job: PrecomputeJob) -> str | None:
        cfg = self.worker.config
        if job.scope != cfg.region or job.model != cfg.model.name:
            return "not_ours"
        if job.expires_at_ms <= wall_ms():
            return "expired"
        return None

    def _join(self) -> Consumer:
        if self._consumer is None:
            self._consumer = kafka_clients.consumer(self.io.settings, self.group, **{
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest", "enable.partition.eof": False,
                "error_cb": self.io.outage.on_error,
                "client.id": f"{self.io.settings.client_id}.{self.worker.config.worker_id}"})
            self._consumer.subscribe([self.topic], on_assign=self._on_assign,
                                     on_revoke=self._on_revoke)
            self._paused = False
            log.info("precompute: joining %s", self.group)
        return self._consumer

    def _leave(self) -> None:
        """Commit what is answered and leave the group at once (a rebalance hands the
        partitions, and the jobs held unanswered, to the replicas still lent)."""
        if self._consumer is None:
            return
        consumer, self._consumer = self._consumer, None
        log.info("precompute: leaving %s", self.group)
        try:
            self._commit(consumer, asynchronous=False)
            consumer.close()
        except Exception as exc:  # the brokers may be away; uncommitted jobs are read again
            log.warning("precompute consumer close: %s", exc)
        with self._lock:
            self._ledger = OffsetLedger()
            self.partitions = []

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        with self._lock:
            self.partitions = sorted({*self.partitions, *(tp.partition for tp in partitions)})
        log.info("precompute: %s takes partitions %s", self.worker.config.worker_id,
                 sorted(tp.partition for tp in partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._commit(consumer, asynchronous=False)
        gone = {tp.partition for tp in partitions}
        with self._lock:
            self.partitions = [p for p in self.partitions if p not in gone]
            self._ledger.drop(gone)
            self._ready = deque(h for h in self._ready if h.partition not in gone)
            if self._current is not None and self._current.partition in gone:
                self._current = None

    def _commit(self, consumer: Consumer, *, asynchronous: bool) -> None:
        with self._lock:
            commits = self._ledger.commits()
        if commits:
            offsets = [TopicPartition(self.topic, p, o) for p, o in sorted(commits.items())]
            try:
                if asynchronous:
                    consumer.commit(offsets=offsets, asynchronous=True)
                else:
                    consumer.commit(offsets=offsets, asynchronous=False)
            except Exception as exc:  # read again after a rebalance: answers are idempotent
                log.warning("precompute commit: %s", exc)

    def _pause(self, consumer: Consumer, full: bool) -> None:
        if full == self._paused:
            return
        assigned = consumer.assignment()
        if full:
            consumer.pause(assigned)
        else:
            consumer.resume(assigned)
        self._paused = full

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"allowed": self._allowed, "held": len(self._ready)
                    + (self._current is not None), "open": self._ledger.open_jobs(),
                    "counts": dict(self.counts), "busy_s": self.busy_s,
                    "partitions": list(self.partitions),
                    "rows_done": self.rows_done}


def _candidate_ids(request: Any, count: int) -> np.ndarray:
    """The candidates' ids (a job's body is msgpack: they are one column)."""
    return np.asarray(request.ids, dtype=np.int64).reshape(-1)[:count]
