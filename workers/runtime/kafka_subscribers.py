"""The worker's two Kafka consumer threads (`workers.runtime.kafka_io` starts them).

- `TargetsSubscriber` reads the compacted targets topic from the beginning of every partition
  (manual assignment, no group commits) and offers each `ControlTargets` for this worker's
  region to its target state; caught up once every partition reached its end.
- `PreemptionSubscriber` reads notices from ``preemption_lookback_s`` ago (one may predate a
  restart) and stops optional work from its own thread at once on one for this replica or
  its pool; the reaction time from the notice's ``ts_ms`` is a histogram.

What does not decode, or (with a signing key) does not verify, is dead-lettered naming why.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

from schemas import kafka_clients, signing
from schemas.clock import wall_ms, wall_ms_fine
from schemas.codec import Codec, ContractError, codec_for
from schemas.contract import ControlTargets, Event, PreemptionNotice
from schemas.kafka_clients import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
    TopicUnavailable,
)

if TYPE_CHECKING:
    from workers.runtime.kafka_io import KafkaIO

log = logging.getLogger("surplus.worker.kafka")
#: librdkafka's own log lines, from every client of the worker (`KafkaIO`'s producer too).
LIBRDKAFKA_LOG = logging.getLogger("surplus.worker.kafka.librdkafka")

#: How often each consumer's lag is read into its gauge (a local call, no broker round trip).
LAG_EVERY_S = 1.0


E = TypeVar("E", bound=Event)

_targets_codec = codec_for(ControlTargets)


_notice_codec = codec_for(PreemptionNotice)


class Subscriber(threading.Thread):
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

    def refuse(self, msg: Message, kind: str, refusal: str,
               event: signing.SignedEvent) -> None:
        """Dead-letter a message that did not verify, naming the key id it names ("none"
        when it names none) and the keys held."""
        keys = self.worker.keys
        held = "none" if keys is None else ", ".join(keys.ring.key_ids)
        key_id = event.key_id if isinstance(event.key_id, str) else "none"
        self.io.deadletters.send(msg, f"{kind}: {refusal} (key id {key_id}; keys held {held})")

    def decode(self, msg: Message, codec: Codec[E]) -> E | str:
        """The message's event, or why there is none: ``tombstone`` (no value) or
        ``deadletter`` (not in the contract; dead-lettered with the codec's reason)."""
        value = msg.value()
        if value is None:
            return "tombstone"
        try:
            return codec.decode(value)
        except ContractError as exc:
            self.io.deadletters.send(msg, str(exc))
            return "deadletter"

    def at_end(self, partition: int) -> None:
        """Reached the current end of a partition."""

    def handle(self, msg: Message) -> str:
        raise NotImplementedError


class TargetsSubscriber(Subscriber):
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
        targets = self.decode(msg, _targets_codec)
        if isinstance(targets, str):
            return targets
        verdict = self.worker.offer_targets(targets).reason
        if verdict in signing.REFUSALS:
            self.refuse(msg, "ControlTargets", verdict, targets)
        return verdict


class PreemptionSubscriber(Subscriber):
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
        notice = self.decode(msg, _notice_codec)
        if isinstance(notice, str):
            return notice
        refusal = self.worker.notice_refusal(notice, path="kafka")
        if refusal is not None:
            self.refuse(msg, "PreemptionNotice", refusal, notice)
            return refusal
        return self.worker.on_preemption(notice, path="kafka", read_ms=read_ms)
