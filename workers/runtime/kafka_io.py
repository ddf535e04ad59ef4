"""The worker's Kafka I/O (confluent-kafka, one background thread per concern).

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
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from schemas import kafka_clients, signing
from schemas.clock import wall_ms, wall_ms_fine
from schemas.codec import ContractError, codec_for, encode
from schemas.contract import ControlTargets, DeadLetter, PreemptionNotice, ReplicaAnnouncement
from schemas.kafka_clients import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
    TopicUnavailable,
)
from schemas.kafka_config import KafkaSettings
from workers.runtime.metrics import WorkerMetrics
from workers.runtime.worker import Worker

log = logging.getLogger("surplus.worker.kafka")
LIBRDKAFKA_LOG = logging.getLogger("surplus.worker.kafka.librdkafka")

#: How often each consumer's lag is read into its gauge (a local call, no broker round trip).
LAG_EVERY_S = 1.0

_targets_codec = codec_for(ControlTargets)
_notice_codec = codec_for(PreemptionNotice)


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
            key_b64=_b64(msg.key()), value_b64=_b64(msg.value()) or "")
        self._producer.produce(self._topic, key=source.encode(), value=encode(letter))
        self._metrics.deadletters.labels(source).inc()
        log.warning("dead-lettered %s[%s]@%s: %s", source, msg.partition(), msg.offset(), reason)

    def send_request(self, source: str, body: bytes, reason: str) -> None:
        """A request nobody may act on (a ``POST /v1/preempt`` refused for its signature),
        kept as a message would be; no partition or offset (-1), ``source`` names the path."""
        letter = DeadLetter(
            ts_ms=self._clock_ms(), source_topic=source, partition=-1, offset=-1,
            reason=reason[:2000], value_b64=_b64(body) or "")
        try:
            self._producer.produce(self._topic, key=source.encode(), value=encode(letter))
        except BufferError:  # the brokers are away; the refusal is still counted
            return
        self._producer.poll(0)
        self._metrics.deadletters.labels(source).inc()
        log.warning("dead-lettered a request to %s: %s", source, reason)


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


class _Subscriber(threading.Thread):
    """A consumer thread on all partitions of one topic, assigned by hand (no group commits)."""

    logical = ""

    def __init__(self, io: KafkaIO) -> None:
        super().__init__(name=f"surplus-kafka-{self.logical}", daemon=True)
        self.io = io
        self.worker = io.worker
        self.topic = io.settings.topic(self.logical)
        self._stop_event = threading.Event()
        self.partitions: list[int] = []

    def stop(self) -> None:
        self._stop_event.set()

    def consumer_config(self) -> dict[str, Any]:
        """librdkafka settings on top of `KafkaSettings` (the group id is set apart)."""
        return {
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "enable.partition.eof": True, "socket.nagle.disable": True,
            "reconnect.backoff.max.ms": 1000, "error_cb": self.io.outage.on_error,
            "logger": LIBRDKAFKA_LOG, "log.connection.close": False,
            "client.id": f"{self.io.settings.client_id}.{self.worker.config.worker_id}"}

    def start_offsets(self, consumer: Consumer, partitions: list[int]) -> list[TopicPartition]:
        return kafka_clients.starting_at(self.topic, partitions, OFFSET_BEGINNING)

    def run(self) -> None:
        """Consume until stopped; a failure restarts the consumer instead of ending the thread
        (targets would otherwise silently stop arriving and expire)."""
        while not self._stop_event.is_set():
            consumer = kafka_clients.consumer(
                self.io.settings, f"surplus-worker.{self.worker.config.worker_id}.{self.logical}",
                **self.consumer_config())
            try:
                if not self._assign(consumer):
                    return
                lag_at = 0.0
                while not self._stop_event.is_set():
                    msg = consumer.poll(0.1)
                    if msg is not None:
                        self._dispatch(msg)
                    if time.monotonic() >= lag_at:
                        lag_at = time.monotonic() + LAG_EVERY_S
                        self._observe_lag(consumer)
            except Exception:
                log.exception("%s subscriber failed; restarting it", self.logical)
                self._stop_event.wait(1.0)
            finally:
                consumer.close()

    def _observe_lag(self, consumer: Consumer) -> None:
        """How far behind this consumer runs: targets or notices waiting unread."""
        self.worker.metrics.kafka_lag.labels(self.logical).set(kafka_clients.lag(consumer))

    def _assign(self, consumer: Consumer) -> bool:
        """Find the partitions (retrying while the brokers are away) and assign them all."""
        while not self._stop_event.is_set():
            try:
                partitions = kafka_clients.partitions(consumer, self.topic, timeout_s=2.0)
                consumer.assign(self.start_offsets(consumer, partitions))
                self.partitions = partitions
                return True
            except (KafkaException, TopicUnavailable) as exc:
                log.warning("cannot assign %s yet: %s", self.topic, exc)
                self._stop_event.wait(1.0)
        return False

    def _dispatch(self, msg: Message) -> None:
        err = msg.error()
        if err is not None:
            if kafka_clients.is_partition_eof(err):
                self.io.outage.healthy()
                self.at_end(msg.partition() or 0)
            else:
                log.warning("%s: %s", self.topic, err)
            return
        self.io.outage.healthy()
        outcome = self.handle(msg)
        self.worker.metrics.kafka_messages.labels(self.logical, outcome).inc()

    def at_end(self, partition: int) -> None:
        """Reached the current end of a partition."""

    def handle(self, msg: Message) -> str:
        raise NotImplementedError


class TargetsSubscriber(_Subscriber):
    """Follows the compacted targets topic from its beginning; see the module docstring."""

    logical = "targets"

    def __init__(self, io: KafkaIO) -> None:
        super().__init__(io)
        self._at_end: set[int] = set()
        self.caught_up = threading.Event()

    def at_end(self, partition: int) -> None:
        self._at_end.add(partition)
        if self.partitions and self._at_end.issuperset(self.partitions):
            self.caught_up.set()

    def handle(self, msg: Message) -> str:
        region = self.worker.config.region
        key = msg.key()
        if key is not None and key != region.encode():
            return "other_scope"
        value = msg.value()
        if value is None:
            return "tombstone"
        try:
            targets = _targets_codec.decode(value)
        except ContractError as exc:
            self.io.deadletters.send(msg, str(exc))
            return "deadletter"
        verdict = self.worker.offer_targets(targets).reason
        if verdict in signing.REFUSALS:
            self.io.deadletters.send(msg, f"ControlTargets: {verdict} (key id "
                                          f"{_key_id(targets)}; keys held "
                                          f"{_held(self.worker)})")
        return verdict


class PreemptionSubscriber(_Subscriber):
    """Stops optional work on a notice for this replica; see the module docstring."""

    logical = "preemption"

    def consumer_config(self) -> dict[str, Any]:
        config = super().consumer_config()
        config.update({"enable.partition.eof": False, "fetch.wait.max.ms": 100})
        return config

    def start_offsets(self, consumer: Consumer, partitions: list[int]) -> list[TopicPartition]:
        """From ``preemption_lookback_s`` ago: a notice may predate this worker's restart."""
        since = wall_ms() - int(self.worker.config.preemption_lookback_s * 1000)
        wanted = [(self.topic, p) for p in partitions]
        for attempt in range(5):  # a just-created topic may not have its leaders yet
            try:
                return kafka_clients.starting_at_time(consumer, wanted, since, timeout_s=5.0)
            except KafkaException as exc:
                error = exc
                if self._stop_event.wait(0.2 * (attempt + 1)):
                    break
        log.warning("no offsets by time on %s (%s); reading new notices only", self.topic, error)
        return kafka_clients.starting_at(self.topic, partitions, OFFSET_END)

    def handle(self, msg: Message) -> str:
        read_ms = wall_ms_fine()
        value = msg.value()
        if value is None:
            return "tombstone"
        try:
            notice = _notice_codec.decode(value)
        except ContractError as exc:
            self.io.deadletters.send(msg, str(exc))
            return "deadletter"
        refusal = self.worker.notice_refusal(notice, path="kafka")
        if refusal is not None:
            self.io.deadletters.send(msg, f"PreemptionNotice: {refusal} (key id "
                                          f"{_key_id(notice)}; keys held "
                                          f"{_held(self.worker)})")
            return refusal
        return self.worker.on_preemption(notice, path="kafka", read_ms=read_ms)


def _key_id(event: signing.SignedEvent) -> str:
    """The key id a message names, for a dead letter's reason ("none" when it names none)."""
    key_id = event.key_id
    return key_id if isinstance(key_id, str) else "none"


def _held(worker: Worker) -> str:
    keys = worker.keys
    return "none" if keys is None else ", ".join(keys.ring.key_ids)


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
        try:
            self.io.producer.produce(self.topic, key=report.region.encode(),
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
        self._started = time.monotonic()

    def start(self) -> None:
        self._started = time.monotonic()
        for thread in (self.preemption, self.targets, self.telemetry, self.membership):
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
        threads = (self.preemption, self.targets, self.telemetry, self.membership)
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
