"""Reading back the control plane's compacted state changelog for newly assigned partitions."""

from __future__ import annotations

import time
from collections.abc import Callable

from schemas import kafka_clients
from schemas.kafka_clients import (
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
    TopicUnavailable,
)
from schemas.kafka_config import KafkaSettings

#: Errors of a cluster that is still settling: a topic created a moment ago has no leader yet,
#: a broker that just came back is still electing. Worth waiting out, not worth a crash.
_SETTLING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
             KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
             KafkaError._ALL_BROKERS_DOWN, KafkaError._WAIT_COORD}


def read_changelog(kafka: KafkaSettings, topic: str, partitions: list[int],
                   timeout_s: float = 60.0) -> dict[str, bytes]:
    """Latest value per key in `partitions` of `topic`, read from the start to the high mark.

    Blocking (run it in a thread). A topic that does not exist yet holds no state; one whose
    metadata has any other error raises ``TopicUnavailable`` (its state is there, unread).
    Errors of a settling cluster are retried until `timeout_s`; then, or on any other error,
    it raises.
    """
    latest: dict[str, bytes] = {}

    def keep(_partition: int, key: bytes, value: bytes | None) -> None:
        if value is None:
            latest.pop(key.decode(), None)
        else:
            latest[key.decode()] = value

    replay_changelog(kafka, topic, dict.fromkeys(partitions), keep, timeout_s)
    return latest


def replay_changelog(kafka: KafkaSettings, topic: str, starts: dict[int, int | None],
                     apply: Callable[[int, bytes, bytes | None], None],
                     timeout_s: float = 60.0) -> dict[int, int]:
    """Hand every record of `topic` from each partition's start (an offset, or None: its
    beginning) to its high mark to `apply(partition, key, value)`, in offset order; a value
    of None is a tombstone. Streams the records, so a large changelog needs no more memory than
    `apply` keeps. Returns the last offset read of each partition that had any to read.

    Blocking (run it in a thread); a missing topic has nothing to read; errors as
    ``read_changelog``'s.
    """
    if not starts:
        return {}
    consumer = kafka_clients.consumer(kafka, f"{topic}-restore", **{
        "enable.auto.commit": False, "enable.partition.eof": True})
    deadline = time.monotonic() + timeout_s
    try:
        try:
            kafka_clients.partitions(consumer, topic, timeout_s)
        except TopicUnavailable as exc:
            if exc.missing:
                return {}
            raise
        todo: dict[int, int] = {}
        assign = []
        for p, start in starts.items():
            low, high = _watermarks(consumer, TopicPartition(topic, p), deadline)
            first = low if start is None else max(low, start)
            if high > first:
                todo[p] = high
                assign.append(TopicPartition(topic, p, first))
        consumer.assign(assign)
        return _read_to(consumer, todo, deadline, apply)
    finally:
        consumer.close()


def _watermarks(consumer: Consumer, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    while True:
        try:
            low, high = consumer.get_watermark_offsets(
                tp, timeout=max(1.0, min(10.0, deadline - time.monotonic())))
            return int(low), int(high)
        except KafkaException as exc:
            err = kafka_clients.kafka_error(exc)
            if err is None or err.code() not in _SETTLING or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def _read_to(consumer: Consumer, todo: dict[int, int], deadline: float,
             apply: Callable[[int, bytes, bytes | None], None]) -> dict[int, int]:
    """Consume assigned partitions until each reached its high mark in `todo`."""
    last: dict[int, int] = {}
    while todo:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            settling = err.code() in _SETTLING and time.monotonic() < deadline
            if not kafka_clients.is_partition_eof(err) and not settling:
                raise KafkaException(err)
            continue
        partition, offset = msg.partition(), msg.offset()
        if partition is None or offset is None:
            continue
        apply(partition, msg.key() or b"", msg.value())
        last[partition] = offset
        if offset + 1 >= todo.get(partition, 0):
            todo.pop(partition, None)
    return last
