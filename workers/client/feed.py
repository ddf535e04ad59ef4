"""The targets feed: a background confluent-kafka consumer of the compacted targets topic.

It reads every partition from the beginning with no consumer group state (a unique group id,
manual assignment, no commits), so each client instance sees the latest target of its scope
after a restart and then follows new ones. Messages of other scopes are skipped by key; messages
of its own scope that do not decode go to the dead-letter topic with the reason and offset.
Decoded targets are handed to `deliver` on the consumer thread; the caller moves them to its own
thread (the RankingClient uses `loop.call_soon_threadsafe`).
"""

from __future__ import annotations

import base64
import threading
import uuid
from collections.abc import Callable

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import ContractError, codec_for
from schemas.contract import ControlTargets, DeadLetter
from schemas.kafka_clients import OFFSET_BEGINNING, Consumer, Message, TopicUnavailable
from schemas.kafka_config import KafkaSettings

DeadLetterSink = Callable[[DeadLetter], None]


class TargetsFeed:
    """Follows the targets topic for one scope on a daemon thread."""

    def __init__(self, kafka: KafkaSettings, scope: str,
                 deliver: Callable[[ControlTargets], None],
                 dead_letter: DeadLetterSink | None = None, poll_timeout_s: float = 0.1) -> None:
        self.kafka = kafka
        self.topic = kafka.topic("targets")
        self.scope = scope
        self._key = scope.encode()
        self._deliver = deliver
        self._dead_letter = dead_letter
        self._poll_timeout_s = poll_timeout_s
        self._codec = codec_for(ControlTargets)
        self._stop = threading.Event()
        self.caught_up = threading.Event()
        self.failed: str | None = None
        self.counters: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, name=f"targets-feed-{scope}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _bump(self, reason: str) -> None:
        self.counters[reason] = self.counters.get(reason, 0) + 1

    def _run(self) -> None:
        try:
            consumer = kafka_clients.consumer(
                self.kafka, f"surplus-client-{self.scope}-{uuid.uuid4().hex}",
                **{"enable.auto.commit": False, "enable.partition.eof": True,
                   "auto.offset.reset": "earliest"})
        except Exception as exc:  # a bad config must not take the ranking service down
            self.failed = f"consumer: {exc}"
            return
        try:
            self._follow(consumer)
        except Exception as exc:
            self.failed = f"feed: {exc}"
        finally:
            consumer.close()

    def _follow(self, consumer: Consumer) -> None:
        partitions = self._partitions(consumer)
        consumer.assign(kafka_clients.starting_at(self.topic, partitions, OFFSET_BEGINNING))
        at_end: set[int] = set()
        while not self._stop.is_set():
            msg = consumer.poll(self._poll_timeout_s)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if kafka_clients.is_partition_eof(err):
                    at_end.add(msg.partition() or 0)
                    if at_end >= set(partitions):
                        self.caught_up.set()
                else:
                    self._bump(f"kafka_error:{err.name()}")
                continue
            self._handle(msg)

    def _partitions(self, consumer: Consumer) -> list[int]:
        """Every partition of the targets topic (waits for the metadata while it is missing)."""
        while not self._stop.is_set():
            try:
                return kafka_clients.partitions(consumer, self.topic, timeout_s=5.0)
            except TopicUnavailable:
                self._bump("topic_missing")
            self._stop.wait(1.0)
        return []

    def _handle(self, msg: Message) -> None:
        if msg.key() != self._key:
            self._bump("other_scope")
            return
        value = msg.value()
        if value is None:
            # A tombstone withdraws nothing early: the held target still lapses at its TTL.
            self._bump("tombstone")
            return
        try:
            targets = self._codec.decode(value)
        except ContractError as exc:
            self._bump("decode_error")
            self._send_dead_letter(msg, value, str(exc))
            return
        self._bump("received")
        self._deliver(targets)

    def _send_dead_letter(self, msg: Message, value: bytes, reason: str) -> None:
        if self._dead_letter is None:
            return
        key = msg.key()
        self._dead_letter(DeadLetter(
            ts_ms=wall_ms(), source_topic=self.topic, partition=msg.partition() or 0,
            offset=msg.offset() or 0, reason=reason[:2000],
            key_b64=None if key is None else base64.b64encode(key).decode(),
            value_b64=base64.b64encode(value).decode()))
