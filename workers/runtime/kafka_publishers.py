"""The worker's two Kafka producer threads (`workers.runtime.kafka_io` starts them).

- `TelemetryPublisher`: a `WindowReport` every report interval, keyed by scope (or by
  replica, for a two-stage control plane: `WorkerConfig.telemetry_key`).
- `MembershipAnnouncer`: the replica's `ReplicaAnnouncement` once it serves, renewed every
  third of its lease, ``draining`` the moment a reclaim reaches it, and a tombstone on a
  clean stop.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING

from schemas.codec import encode
from schemas.contract import ReplicaAnnouncement
from schemas.kafka_clients import (
    KafkaError,
    Message,
)

if TYPE_CHECKING:
    from workers.runtime.kafka_io import KafkaIO

log = logging.getLogger("surplus.worker.kafka")


class TelemetryPublisher(threading.Thread):
    """Publishes a `WindowReport` every report interval and serves producer callbacks."""

    def __init__(self, io: KafkaIO) -> None:
        super().__init__(name="surplus-kafka-telemetry", daemon=True)
        self.io = io
        self.topic = io.settings.topic("telemetry")
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        interval = self.io.worker.config.report_interval_s
        next_at = time.monotonic() + interval
        producer = self.io.producer
        while not self._stop_event.is_set():
            producer.poll(max(0.0, min(0.1, next_at - time.monotonic())))
            if time.monotonic() >= next_at:
                self.publish()
                next_at = max(next_at + interval, time.monotonic())
        self.publish()  # the last partial window; KafkaIO.stop flushes it

    def publish(self) -> None:
        worker = self.io.worker
        report = worker.window_report()
        by_replica = worker.config.telemetry_key == "replica"
        key = report.worker_id if by_replica else report.region
        try:
            self.io.producer.produce(self.topic, key=key.encode(),
                                     value=encode(report), on_delivery=self._delivered)
        except BufferError:  # the local queue is full while the brokers are away
            worker.metrics.reports.labels("dropped").inc()

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        metrics = self.io.worker.metrics
        if err is None:
            metrics.reports.labels("published").inc()
            self.io.outage.healthy()
        else:
            metrics.reports.labels("failed").inc()
            self.io.outage.down(str(err))


class MembershipAnnouncer(threading.Thread):
    """Announces this replica on the replicas topic; see the module docstring.

    The state follows the worker's own: ``serving`` once it is ready, ``draining`` from the
    moment it is reclaimed or stopping (``Worker.drain_listeners`` wake this thread, so the
    announcement does not wait for the next renewal). Nothing is announced before the worker
    first serves: a replica still loading its model is not one clients may call.
    """

    #: How often the worker's readiness is looked at while nothing wakes the thread.
    CHECK_EVERY_S = 0.05

    def __init__(self, io: KafkaIO) -> None:
        super().__init__(name="surplus-kafka-membership", daemon=True)
        self.io = io
        self.worker = io.worker
        self.topic = io.settings.topic("replicas")
        self._key = self.worker.config.worker_id.encode()
        self._stop_event = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self.announced: str | None = None
        self.worker.drain_listeners.append(self._drain_changed)

    def stop(self) -> None:
        self._stop_event.set()
        self._wake.set()

    def run(self) -> None:
        config = self.worker.config
        renew_s = config.membership_lease_s / 3.0
        renew_at = 0.0
        while not self._stop_event.is_set():
            state = self._state()
            if state is not None and (state != self.announced or time.monotonic() >= renew_at):
                self.announce(state)
                renew_at = time.monotonic() + renew_s
            self._wake.wait(self.CHECK_EVERY_S)
            self._wake.clear()

    def _drain_changed(self) -> None:
        """A reclaim or SIGTERM reached the worker: say ``draining`` now, on the thread that
        learnt it, rather than at this thread's next look (clients stop routing here sooner)."""
        if self.worker.draining and self.announced == "serving":
            self.announce("draining")
        self._wake.set()

    def _state(self) -> str | None:
        worker = self.worker
        if worker.draining:
            return "draining" if self.announced is not None else None
        if worker.endpoint is None or not worker.readiness()[0]:
            return None
        return "serving"

    def announce(self, state: str) -> None:
        """Send one announcement now (any thread; the producer is thread-safe)."""
        worker, config = self.worker, self.worker.config
        endpoint = worker.endpoint
        if endpoint is None:
            return
        now = worker.clock_ms()
        deadline = worker.draining_deadline_ms if state == "draining" else None
        announcement = ReplicaAnnouncement(
            replica_id=config.worker_id, endpoint=endpoint, region=config.region,
            pool_id=config.pool, tier=config.tier, model=config.model.name,
            state=state, ts_ms=now,  # type: ignore[arg-type]
            lease_expires_at_ms=now + int(config.membership_lease_s * 1000),
            deadline_ms=deadline)
        with self._lock:
            try:
                self.io.producer.produce(self.topic, key=self._key, value=encode(announcement))
            except BufferError:
                worker.metrics.announcements.labels("dropped").inc()
                return
            self.announced = state
        self.io.producer.poll(0)
        worker.metrics.announcements.labels(state).inc()

    def withdraw(self) -> None:
        """The tombstone of a clean stop: clients drop this replica without waiting for its
        lease. Only a replica that announced itself leaves one."""
        with self._lock:
            if self.announced is None:
                return
            with contextlib.suppress(BufferError):
                self.io.producer.produce(self.topic, key=self._key, value=None)
                self.announced = None
                self.worker.metrics.announcements.labels("tombstone").inc()
