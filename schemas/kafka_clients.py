"""Every confluent-kafka (librdkafka) client of Surplus is built here, and only here.

Connection and security come from `KafkaSettings` (bootstrap, TLS, SASL, client id); a caller
names only what is particular to its use: a group id, a latency setting, a callback. Besides
the builders, this module holds what the callers would otherwise each write again:

- the partitions of a topic (`partitions`, raising `TopicUnavailable` when there are none);
- manual assignment, no group commits: `starting_at` a fixed position (``OFFSET_BEGINNING``,
  ``OFFSET_END``, an offset) or `starting_at_time` (``offsets_for_times``; a partition with
  nothing that recent starts at its end), then ``consumer.assign``;
- end of partition: with ``enable.partition.eof`` a consumer reports reaching a partition's
  current end as an error event, which `is_partition_eof` tells from a real error;
- the `KafkaError` inside a `KafkaException` (`kafka_error`), producing through a full local
  queue (`produce_waiting`), and a logger that swallows librdkafka's own logs (`silent_logger`).

The control plane's Faust/aiokafka clients are built from the same settings by `streams.app`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from schemas.kafka_config import KafkaSettings

__all__ = [
    "OFFSET_BEGINNING", "OFFSET_END", "AclBinding", "AclOperation", "AclPermissionType",
    "AdminClient", "ConfigResource", "Consumer", "KafkaError", "KafkaException", "Message",
    "NewTopic", "Producer", "ResourcePatternType", "ResourceType", "TopicPartition",
    "TopicUnavailable", "admin", "consumer", "is_partition_eof", "kafka_error", "partitions",
    "produce_waiting", "producer", "silent_logger", "starting_at", "starting_at_time",
]


# -- clients --------------------------------------------------------------------------------------

def producer(settings: KafkaSettings, **extra: Any) -> Producer:
    """A producer with murmur2 partitioning (`KafkaSettings.producer`), `extra` on top."""
    return Producer(settings.producer(**extra))


#: A preemption notice is worth milliseconds: sent at once (no linger) and without Nagle's
#: algorithm, which holds a small write back while an earlier one is unacknowledged.
NOTICE_PRODUCER = {"linger.ms": 0, "socket.nagle.disable": True}


def notice_producer(settings: KafkaSettings, **extra: Any) -> Producer:
    """A producer for preemption notices (``NOTICE_PRODUCER``), `extra` on top."""
    return producer(settings, **{**NOTICE_PRODUCER, **extra})


def consumer(settings: KafkaSettings, group_id: str, **extra: Any) -> Consumer:
    """A consumer in group `group_id` (Surplus assigns partitions by hand and commits nothing;
    librdkafka still wants a group id), `extra` on top of the settings."""
    return Consumer(settings.confluent(**{"group.id": group_id, **extra}))


def admin(settings: KafkaSettings | Mapping[str, Any], **extra: Any) -> AdminClient:
    """An admin client from `settings`, or from a librdkafka config built already (a tool that
    talks to a loopback broker outside any settings)."""
    if isinstance(settings, KafkaSettings):
        return AdminClient(settings.confluent(**extra))
    return AdminClient({**settings, **extra})


# -- partitions and assignment --------------------------------------------------------------------

class TopicUnavailable(LookupError):
    """A topic that does not exist (yet), has an error in its metadata, or has no partitions.

    ``missing``: the broker said the topic does not exist. Only then does the topic hold
    nothing; any other metadata error (a leader being elected while a broker is down) says
    nothing about what the topic holds, so a reader of stored state retries it."""

    def __init__(self, message: str, *, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def partitions(client: Consumer | AdminClient, topic: str, timeout_s: float) -> list[int]:
    """The partition ids of `topic`, sorted.

    Raises `TopicUnavailable` (naming why) when there is nothing to read, and `KafkaException`
    when the cluster does not answer within `timeout_s`.
    """
    meta = client.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if meta is None:
        raise TopicUnavailable(f"topic {topic} does not exist", missing=True)
    if meta.error is not None:
        missing = meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        raise TopicUnavailable(f"topic {topic}: {meta.error}", missing=missing)
    if not meta.partitions:
        raise TopicUnavailable(f"topic {topic} has no partitions")
    return sorted(meta.partitions)


def starting_at(topic: str, partitions: Iterable[int], offset: int) -> list[TopicPartition]:
    """`partitions` of `topic` at one position: ``OFFSET_BEGINNING``, ``OFFSET_END`` or an
    offset (or, for ``offsets_for_times``, a timestamp in ms)."""
    return [TopicPartition(topic, p, offset) for p in partitions]


def starting_at_time(consumer: Consumer, wanted: Iterable[tuple[str, int]], ts_ms: int,
                     timeout_s: float) -> list[TopicPartition]:
    """Each (topic, partition) at its first message stamped `ts_ms` or later; a partition with
    nothing that recent starts at its end. Raises `KafkaException` when a leader does not
    answer in `timeout_s` (a topic created a moment ago may have none yet)."""
    asked = [TopicPartition(topic, p, ts_ms) for topic, p in wanted]
    found = consumer.offsets_for_times(asked, timeout=timeout_s)
    return [TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END)
            for tp in found]


def lag(consumer: Consumer) -> int:
    """Messages between a consumer's positions and the ends of its assigned partitions, from
    the watermarks its last fetches brought (no broker round trip). A partition with no
    position yet (nothing read since it was assigned at its end) counts as caught up."""
    behind = 0
    for tp in consumer.position(consumer.assignment()):
        _, high = consumer.get_watermark_offsets(tp, cached=True)
        if tp.offset >= 0 and high >= 0:
            behind += max(0, high - tp.offset)
    return behind


def is_partition_eof(err: KafkaError | None) -> bool:
    """True for the event a consumer with ``enable.partition.eof`` sends on reaching the
    current end of a partition: a position, not an error."""
    return err is not None and err.code() == KafkaError._PARTITION_EOF


# -- errors, producing, logging -------------------------------------------------------------------

def kafka_error(exc: BaseException) -> KafkaError | None:
    """The `KafkaError` a `KafkaException` carries (None when it carries only text)."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def produce_waiting(producer: Producer, topic: str, **message: Any) -> None:
    """Produce one message, serving delivery callbacks while the local queue is full."""
    while True:
        try:
            producer.produce(topic, **message)
            return
        except BufferError:
            producer.poll(0.05)


def silent_logger(name: str) -> logging.Logger:
    """A logger for librdkafka's ``logger`` setting that shows nothing: for probes whose
    failures are the expected answer (a broker not up yet, a refused certificate)."""
    logger = logging.getLogger(name)
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger
