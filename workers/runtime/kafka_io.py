"""The worker's Kafka I/O (confluent-kafka, one background thread per concern): `KafkaIO` owns
the producer they share, the outage tracker and the dead-letter sink, and starts the threads
(`kafka_subscribers`, `kafka_publishers`).

- **Targets subscriber**: reads the compacted targets topic from the beginning of every
  partition (manual assignment, no consumer-group commits: each worker needs the whole latest
  state, not a share of it) and follows it, offering each `ControlTargets` keyed by this
  worker's region to its `TargetState`. It reports "caught up" once every partition reached its
  end, which /readyz waits for (up to a bound).
- **Preemption subscriber**: on a `PreemptionNotice` for this worker's pool (and this replica,
  or the whole pool) it stops optional work from this thread at once — admission and target
  state are thread-safe — and the reaction time from the notice's ``ts_ms`` is a histogram.
- **Membership announcer**: once the worker serves (ready), a `ReplicaAnnouncement` keyed by
  its replica id on the compacted replicas topic, renewed every third of its lease; the moment
  a reclaim reaches it (a notice for it, SIGTERM) it says ``draining``, and on a clean stop it
  leaves a tombstone. Clients route from these (``workers.client.membership_feed``).
- **Telemetry publisher**: every report interval a `WindowReport`, keyed by scope (the region,
  like every input topic, so the control-plane process owning a scope gets all of its inputs).

Undecodable messages, and with a signing key targets and notices that do not verify (unsigned,
an unknown key id, a bad signature: `schemas.signing`), go to the dead-letter topic with the
reason and their source topic/partition/offset. When the brokers are unreachable nothing on
the request path waits for Kafka: the worker keeps serving baseline, held targets expire to
baseline only by their TTL, the outage is counted, and librdkafka reconnects by itself when
the brokers return.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from schemas import kafka_clients
from schemas.codec import encode
from schemas.contract import DeadLetter, PreemptionNotice
from schemas.kafka_clients import KafkaError, Message, Producer
from schemas.kafka_config import KafkaSettings
from workers.runtime.kafka_publishers import MembershipAnnouncer, TelemetryPublisher
from workers.runtime.kafka_subscribers import (
    LIBRDKAFKA_LOG,
    PreemptionSubscriber,
    TargetsSubscriber,
)
from workers.runtime.metrics import WorkerMetrics
from workers.runtime.precompute import PrecomputeRunner
from workers.runtime.worker import Worker

log = logging.getLogger("surplus.worker.kafka")


class Stoppable(Protocol):
    """One of the I/O threads."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...


class OutageTracker:
    """Counts transitions from "brokers answer" to "no broker answers" (thread-safe)."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics
        self._lock = threading.Lock()
        self.up: bool | None = None
        self.outages = 0

    def on_error(self, err: KafkaError) -> None:
        """librdkafka's ``error_cb``: only "all brokers down" means an outage."""
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self.down(str(err))

    def down(self, why: str) -> None:
        with self._lock:
            if self.up is False:
                return
            self.up = False
            self.outages += 1
        self._metrics.kafka_outages.inc()
        self._metrics.kafka_up.set(0)
        log.warning("Kafka unreachable (%s); serving baseline, targets expire by TTL", why)

    def healthy(self) -> None:
        with self._lock:
            if self.up is True:
                return
            recovered = self.up is False
            self.up = True
        self._metrics.kafka_up.set(1)
        if recovered:
            log.info("Kafka reachable again")


class DeadLetterSink:
    """Sends a message nobody can use to the dead-letter topic, keyed by its source topic."""

    def __init__(self, producer: Producer, settings: KafkaSettings, metrics: WorkerMetrics,
                 clock_ms: Callable[[], int]) -> None:
        self._producer = producer
        self._topic = settings.topic("deadletter")
        self._metrics = metrics
        self._clock_ms = clock_ms

    def send(self, msg: Message, reason: str) -> None:
        source = msg.topic() or "unknown"
        letter = DeadLetter(
            ts_ms=self._clock_ms(), source_topic=source, partition=msg.partition() or 0,
            offset=msg.offset() or 0, reason=reason[:2000],
            key_b64=b64(msg.key()), value_b64=b64(msg.value()) or "")
        self._producer.produce(self._topic, key=source.encode(), value=encode(letter))
        self._metrics.deadletters.labels(source).inc()
        log.warning("dead-lettered %s[%s]@%s: %s", source, msg.partition(), msg.offset(), reason)

    def send_request(self, source: str, body: bytes, reason: str) -> None:
        """A request nobody may act on (a ``POST /v1/preempt`` refused for its signature),
        kept as a message would be; no partition or offset (-1), ``source`` names the path."""
        letter = DeadLetter(
            ts_ms=self._clock_ms(), source_topic=source, partition=-1, offset=-1,
            reason=reason[:2000], value_b64=b64(body) or "")
        try:
            self._producer.produce(self._topic, key=source.encode(), value=encode(letter))
        except BufferError:  # the brokers are away; the refusal is still counted
            return
        self._producer.poll(0)
        self._metrics.deadletters.labels(source).inc()
        log.warning("dead-lettered a request to %s: %s", source, reason)


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


class KafkaIO:
    """The three Kafka threads of one worker, sharing one producer and one outage tracker."""

    def __init__(self, worker: Worker, settings: KafkaSettings) -> None:
        self.worker = worker
        self.settings = settings
        self.outage = OutageTracker(worker.metrics)
        self.producer = kafka_clients.producer(settings, **{
            "linger.ms": 5, "message.timeout.ms": 10_000, "socket.nagle.disable": True,
            "queue.buffering.max.messages": 10_000, "reconnect.backoff.max.ms": 1000,
            "error_cb": self.outage.on_error, "logger": LIBRDKAFKA_LOG,
            "log.connection.close": False,
            "client.id": f"{settings.client_id}.{worker.config.worker_id}"})
        self.deadletters = DeadLetterSink(self.producer, settings, worker.metrics,
                                          worker.clock_ms)
        self.targets = TargetsSubscriber(self)
        self.preemption = PreemptionSubscriber(self)
        self.telemetry = TelemetryPublisher(self)
        self.membership = MembershipAnnouncer(self)
        #: The precompute lever's consumer and idle work, where the config enables it.
        self.precompute = (PrecomputeRunner(self) if worker.config.precompute.enabled
                           else None)
        self._started = time.monotonic()

    def _threads(self) -> tuple[Stoppable, ...]:
        threads: tuple[Stoppable, ...] = (self.preemption, self.targets, self.telemetry,
                                          self.membership)
        return threads + ((self.precompute,) if self.precompute is not None else ())

    def start(self) -> None:
        self._started = time.monotonic()
        if self.precompute is not None:
            self.worker.batcher.set_idle_work(self.precompute)
        for thread in self._threads():
            thread.start()

    def publish_notice(self, notice: PreemptionNotice, timeout_s: float) -> bool:
        """Send this replica's own notice (SIGTERM) and wait up to ``timeout_s`` for the broker
        to take it; False when it could not (the control plane then learns from the lapsed
        telemetry and the scheduler instead)."""
        self.producer.produce(self.settings.topic("preemption"), key=notice.region.encode(),
                              value=encode(notice))
        return self.producer.flush(timeout_s) == 0

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the threads, deliver what is queued (briefly: the brokers may be away), close."""
        threads = self._threads()
        if self.precompute is not None:
            self.worker.batcher.set_idle_work(None)
        for thread in threads:
            thread.stop()
        for thread in threads:
            if thread.is_alive():
                thread.join(timeout_s)
        self.membership.withdraw()
        if self.producer.flush(2.0):
            self.producer.purge()  # undeliverable now; their callbacks count them as failed
            self.producer.flush(0.5)
        self.producer.close()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Ready once targets are read to their end, or after giving up on that (bounded)."""
        if self.targets.caught_up.is_set():
            state = "caught_up"
        elif time.monotonic() - self._started >= self.worker.config.readiness_timeout_s:
            state = "gave_up"
        else:
            state = "catching_up"
        detail = {"targets": state, "outages": self.outage.outages,
                  "up": self.outage.up, "preemption_partitions": len(self.preemption.partitions)}
        return state != "catching_up", detail
