"""The client's feeds: background confluent-kafka consumers of the compacted topics it follows.

`TargetsFeed` follows the targets topic, `MembershipFeed` the replicas topic; both are a
`CompactedFeed`. Each reads every partition from the beginning with no consumer group state
(a unique group id, manual assignment, no commits), so each client instance sees the latest
value of every key after a restart and then follows new ones. Targets of other scopes are
skipped by key; messages that do not decode go to the dead-letter topic with the reason and
offset. Decoded values are handed to `deliver` on the consumer thread; the caller moves them to
its own thread (the RankingClient uses `loop.call_soon_threadsafe`). A target comes with a
`Refuse` for its message: the target state's verdict decides whether it is dead-lettered, as
on the worker, so an expired target is never refused for its key (`workers.policy.targets`).
"""

from __future__ import annotations

import base64
import threading
import uuid
from collections.abc import Callable
from typing import TypeVar

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import Codec, ContractError, codec_for
from schemas.contract import ControlTargets, DeadLetter, Event, ReplicaAnnouncement
from schemas.kafka_clients import OFFSET_BEGINNING, Consumer, Message, TopicUnavailable
from schemas.kafka_config import KafkaSettings

E = TypeVar("E", bound=Event)
DeadLetterSink = Callable[[DeadLetter], None]
#: Dead-letters the message a target came in with, naming the refusal (a signature verdict).
Refuse = Callable[[str], None]


class CompactedFeed:
    """Follows one compacted topic on a daemon thread; a subclass says what a message means."""

    logical = ""

    def __init__(self, kafka: KafkaSettings, scope: str,
                 dead_letter: DeadLetterSink | None = None, poll_timeout_s: float = 0.1) -> None:
        self.kafka = kafka
        self.topic = kafka.topic(self.logical)
        self.scope = scope
        self._dead_letter = dead_letter
        self._poll_timeout_s = poll_timeout_s
        self._stop = threading.Event()
        self.caught_up = threading.Event()
        self.failed: str | None = None
        self.counters: dict[str, int] = {}
        self._thread = threading.Thread(target=self._run, name=f"{self.logical}-feed-{scope}",
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
                self.kafka, f"surplus-client-{self.scope}-{self.logical}-{uuid.uuid4().hex}",
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
        """Every partition of the topic (waits for the metadata while it is missing)."""
        while not self._stop.is_set():
            try:
                return kafka_clients.partitions(consumer, self.topic, timeout_s=5.0)
            except TopicUnavailable:
                self._bump("topic_missing")
            self._stop.wait(1.0)
        return []

    def _handle(self, msg: Message) -> None:
        raise NotImplementedError

    def _decoded(self, codec: Codec[E], msg: Message, value: bytes) -> E | None:
        """The value as ``codec``'s event, or None once it is counted and dead-lettered."""
        try:
            return codec.decode(value)
        except ContractError as exc:
            self._bump("decode_error")
            self._send_dead_letter(msg, value, str(exc))
            return None

    def _send_dead_letter(self, msg: Message, value: bytes, reason: str) -> None:
        if self._dead_letter is None:
            return
        key = msg.key()
        self._dead_letter(DeadLetter(
            ts_ms=wall_ms(), source_topic=self.topic, partition=msg.partition() or 0,
            offset=msg.offset() or 0, reason=reason[:2000],
            key_b64=None if key is None else base64.b64encode(key).decode(),
            value_b64=base64.b64encode(value).decode()))


class TargetsFeed(CompactedFeed):
    """Follows the targets topic for one scope."""

    logical = "targets"

    def __init__(self, kafka: KafkaSettings, scope: str,
                 deliver: Callable[[ControlTargets, Refuse], None],
                 dead_letter: DeadLetterSink | None = None,
                 poll_timeout_s: float = 0.1) -> None:
        """``deliver(targets, refuse)``: every decoded target of this scope. The target state
        judges it (the one place the client counts targets by verdict); on a signature
        refusal the caller calls ``refuse(verdict)``, which dead-letters the message with its
        offset, which only this thread knows."""
        super().__init__(kafka, scope, dead_letter, poll_timeout_s)
        self._key = scope.encode()
        self._deliver = deliver
        self._codec = codec_for(ControlTargets)

    def _handle(self, msg: Message) -> None:
        if msg.key() != self._key:
            self._bump("other_scope")
            return
        value = msg.value()
        if value is None:
            # A tombstone withdraws nothing early: the held target still lapses at its TTL.
            self._bump("tombstone")
            return
        targets = self._decoded(self._codec, msg, value)
        if targets is None:
            return
        key_id = targets.key_id if isinstance(targets.key_id, str) else "none"

        def refuse(verdict: str) -> None:
            self._send_dead_letter(msg, value, f"ControlTargets: {verdict} (key id {key_id})")

        self._bump("received")
        self._deliver(targets, refuse)


class MembershipFeed(CompactedFeed):
    """Follows the replicas topic: every replica's latest announcement, and its tombstone.

    ``deliver(replica_id, announcement)`` gets None for a tombstone. Announcements of other
    regions are delivered too (the membership set skips and counts them): the topic is keyed
    by replica id, not scope. A value whose ``replica_id`` is not its key is dead-lettered: a
    tombstone under the key would not remove it.
    """

    logical = "replicas"

    def __init__(self, kafka: KafkaSettings, scope: str,
                 deliver: Callable[[str, ReplicaAnnouncement | None], None],
                 dead_letter: DeadLetterSink | None = None, poll_timeout_s: float = 0.1) -> None:
        super().__init__(kafka, scope, dead_letter, poll_timeout_s)
        self._deliver = deliver
        self._codec = codec_for(ReplicaAnnouncement)

    def _handle(self, msg: Message) -> None:
        raw_key = msg.key()
        value = msg.value()
        if raw_key is None:
            self._bump("no_key")
            if value is not None:
                self._send_dead_letter(msg, value, "ReplicaAnnouncement: message has no key "
                                                   "(the replica id)")
            return
        key = raw_key.decode(errors="replace")
        if value is None:
            self._bump("tombstone")
            self._deliver(key, None)
            return
        announcement = self._decoded(self._codec, msg, value)
        if announcement is None:
            return
        if announcement.replica_id != key:
            self._bump("key_mismatch")
            self._send_dead_letter(msg, value, f"ReplicaAnnouncement: `$.replica_id` is "
                                               f"{announcement.replica_id!r} but the key is "
                                               f"{key!r}")
            return
        self._bump("received")
        self._deliver(key, announcement)
