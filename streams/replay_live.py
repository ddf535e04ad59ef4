"""Event logs and a live cluster: publish a log into Kafka, and record live topics into a log.

``publish_log`` replays a log into the topics of a prefix (the log holds logical topic names,
so ``--prefix`` is the remapping), keyed as logged, with each message's timestamp set to the
event time. With ``speed`` X > 0 it keeps the log's inter-arrival times divided by X (1 = real
time); with 0 it sends as fast as the producer takes them. ``rebase`` shifts every timestamp,
inside the values too, so the first event happens now: a staging control plane then sees
yesterday's traffic as today's (grants that had expired by now would otherwise be dead on
arrival).

``record_log`` taps the topics with a consumer that is assigned partitions by hand and never
commits (recording leaves no trace on the cluster), starting from the beginning, the end, a
time (``offsets_for_times``) or an offset, and stops after a duration, when every partition is
caught up, or on Ctrl-C. Messages are merged across partitions into time order by a
watermark: an event is written once every partition still being read has moved past its
timestamp, or has nothing more right now. Ties on the timestamp are broken by topic (log
order), partition and offset, so recording what a replay published gives back the same log.
"""

from __future__ import annotations

import heapq
import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import (
    ContractError,
    codec_for,
    decode_labels,
    decode_outcomes,
    decode_telemetry,
    encode,
)
from schemas.contract import (
    CapacityEvent,
    ControlTargets,
    Event,
    OutcomeLabel,
    PreemptionNotice,
    RoutingOutcome,
    WindowReport,
)
from schemas.kafka_clients import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaException,
    TopicPartition,
)
from schemas.kafka_config import KafkaSettings
from schemas.topics import scope_partition, spec
from streams.eventlog import (
    TOPIC_ORDER,
    TOPICS,
    VALUE_TYPES,
    AnyEvent,
    EventLogError,
    EventLogWriter,
    read_events,
)
from streams.replay_output import Progress

ProgressHook = Callable[[str], None]


class LiveError(RuntimeError):
    """Publishing or recording failed; the message says what and where."""


# -- time rebasing --------------------------------------------------------------------------------

def shift_value(value: Event, delta_ms: int) -> Event:
    """``value`` with every event-time field moved by ``delta_ms`` (durations unchanged)."""
    if delta_ms == 0:
        return value
    replace = msgspec.structs.replace
    if isinstance(value, WindowReport):
        return replace(value, window_start_ms=value.window_start_ms + delta_ms,
                       window_end_ms=value.window_end_ms + delta_ms)
    if isinstance(value, CapacityEvent):
        expires = None if value.expires_at_ms is None else value.expires_at_ms + delta_ms
        return replace(value, ts_ms=value.ts_ms + delta_ms, expires_at_ms=expires)
    if isinstance(value, PreemptionNotice):
        return replace(value, ts_ms=value.ts_ms + delta_ms,
                       deadline_ms=value.deadline_ms + delta_ms)
    if isinstance(value, ControlTargets):
        return replace(value, issued_at_ms=value.issued_at_ms + delta_ms)
    if isinstance(value, (RoutingOutcome, OutcomeLabel)):
        return replace(value, ts_ms=value.ts_ms + delta_ms)
    raise TypeError(f"cannot rebase a {type(value).__name__}")


# -- publishing -----------------------------------------------------------------------------------

@dataclass
class PublishStats:
    events: int = 0
    delivered: int = 0
    failed: int = 0
    bad_lines: int = 0
    by_topic: dict[str, int] = field(default_factory=dict)
    first_error: str | None = None
    behind_ms_max: float = 0.0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"events": self.events, "delivered": self.delivered, "failed": self.failed,
                "bad_lines": self.bad_lines, "by_topic": dict(sorted(self.by_topic.items())),
                "first_error": self.first_error, "behind_ms_max": round(self.behind_ms_max, 1),
                "seconds": round(self.seconds, 3)}


def publish_log(log: str | Path, kafka: KafkaSettings, *, speed: float = 0.0,
                rebase: bool = False, strict: bool = False, progress: bool = False,
                delivery_timeout_s: float = 30.0,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> PublishStats:
    """Publish every event of ``log`` into ``kafka``'s topics; see the module docstring."""
    if speed < 0:
        raise ValueError(f"speed must be >= 0 (0 = as fast as possible), got {speed}")
    reader = read_events(log, strict=strict)
    stats = PublishStats()
    producer = kafka_clients.producer(kafka, **{
        "client.id": "surplus-replay", "enable.idempotence": True,
        "message.timeout.ms": max(1, round(delivery_timeout_s * 1000))})
    topics = {topic: kafka.topic(topic) for topic in TOPICS}
    labels_partitions = spec("labels").partitions
    meter = Progress(f"publish {Path(log).name}", enabled=progress)

    def delivered(err: Any, _msg: Any) -> None:
        if err is None:
            stats.delivered += 1
        else:
            stats.failed += 1
            stats.first_error = stats.first_error or str(err)

    started = clock()
    first_ts: int | None = None
    delta = 0
    try:
        for event in reader:
            if first_ts is None:
                first_ts = event.ts
                delta = wall_ms() - event.ts if rebase else 0
            if speed > 0:
                due = started + (event.ts - first_ts) / 1000.0 / speed
                wait = due - clock()
                if wait > 0:
                    _wait(producer, wait, sleep)
                else:
                    stats.behind_ms_max = max(stats.behind_ms_max, -wait * 1000.0)
            value = shift_value(event.value, delta)
            where = ({"partition": scope_partition(value.scope, labels_partitions)}
                     if isinstance(value, OutcomeLabel) else {})
            kafka_clients.produce_waiting(producer, topics[event.topic], key=event.key,
                                          value=encode(value), timestamp=event.ts + delta,
                                          on_delivery=delivered, **where)
            stats.events += 1
            stats.by_topic[event.topic] = stats.by_topic.get(event.topic, 0) + 1
            if not stats.events & 0x3FF:
                producer.poll(0)
                meter.update(f"{stats.events:,} events sent, {stats.delivered:,} delivered")
        remaining = producer.flush(delivery_timeout_s + 5.0)
    except KafkaException as exc:
        raise LiveError(f"producing to {kafka.bootstrap} failed: {exc}") from None
    stats.bad_lines = reader.bad_lines
    stats.seconds = clock() - started
    if remaining:
        stats.failed += remaining
        stats.first_error = stats.first_error or f"{remaining} messages undelivered at the end"
    meter.done(f"{stats.delivered:,}/{stats.events:,} delivered")
    return stats


def _wait(producer: Any, seconds: float, sleep: Callable[[float], None]) -> None:
    """Wait while serving delivery callbacks (a long gap must not stall delivery reports)."""
    if seconds > 0.05:
        producer.poll(min(seconds, 0.05))
        seconds -= 0.05
    if seconds > 0:
        sleep(seconds)


# -- recording ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StartAt:
    """Where recording starts in every partition: ``beginning``, ``end``, a time or an offset."""

    kind: str = "beginning"
    value: int = 0

    @classmethod
    def parse(cls, text: str) -> StartAt:
        """``beginning`` | ``end`` | ``time:<ms since epoch or ISO-8601>`` | ``offset:<n>``."""
        text = text.strip()
        if text in ("beginning", "end"):
            return cls(text)
        kind, _, rest = text.partition(":")
        if kind == "offset" and rest.strip().isdigit():
            return cls("offset", int(rest))
        if kind == "time" and rest:
            return cls("time", parse_time_ms(rest))
        raise ValueError(f"start must be beginning, end, time:<ms|ISO-8601> or offset:<n>; "
                         f"got {text!r}")


def parse_time_ms(text: str) -> int:
    """Milliseconds since the epoch from digits or an ISO-8601 time (UTC if no zone)."""
    from datetime import UTC, datetime

    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a time: {text!r} (use ms since epoch or ISO-8601)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


@dataclass
class RecordStats:
    events: int = 0
    by_topic: dict[str, int] = field(default_factory=dict)
    invalid: dict[str, int] = field(default_factory=dict)
    out_of_order: int = 0
    partitions: int = 0
    stopped: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"events": self.events, "by_topic": dict(sorted(self.by_topic.items())),
                "invalid": dict(sorted(self.invalid.items())), "out_of_order": self.out_of_order,
                "partitions": self.partitions, "stopped": self.stopped,
                "seconds": round(self.seconds, 3)}


class _Merge:
    """Per-partition watermarks and a heap that releases events in (ts, topic, part, offset)."""

    def __init__(self, partitions: list[tuple[str, int]],
                 ends: dict[tuple[str, int], tuple[int, int]] | None = None) -> None:
        self.last_ts: dict[tuple[str, int], int | None] = dict.fromkeys(partitions)
        self.at_end: dict[tuple[str, int], bool] = dict.fromkeys(partitions, False)
        #: (next offset to read, end offset when the recording started) per partition: the
        #: end that ``caught_up`` waits for (None: the partition-EOF events alone).
        self.positions = dict(ends) if ends is not None else None
        self.heap: list[tuple[int, int, int, int, int, str, str | None, Event]] = []
        self._seq = itertools.count()

    def push(self, topic: str, partition: int, offset: int, ts: int, key: str | None,
             value: Event) -> None:
        tp = (topic, partition)
        self.last_ts[tp] = ts
        self.at_end[tp] = False
        # The sequence number keeps reports of one batch (same offset) in their batch order.
        heapq.heappush(self.heap, (ts, TOPIC_ORDER[topic], partition, offset, next(self._seq),
                                   topic, key, value))

    def consumed(self, topic: str, partition: int, offset: int) -> None:
        """A message was read at ``offset`` (whether or not it decodes)."""
        tp = (topic, partition)
        if self.positions is not None and tp in self.positions:
            pos, end = self.positions[tp]
            self.positions[tp] = (max(pos, offset + 1), end)

    def eof(self, topic: str, partition: int) -> None:
        self.at_end[(topic, partition)] = True

    def _done(self, tp: tuple[str, int]) -> bool:
        """At its end, and past the end it had when the recording started: a partition-EOF
        event alone is not proof (under load one came before the messages a fresh consumer
        had still to fetch)."""
        if not self.at_end[tp]:
            return False
        if self.positions is None or tp not in self.positions:
            return True
        pos, end = self.positions[tp]
        return pos >= end

    def caught_up(self) -> bool:
        """Every partition done (``_done``): the recording stopped without the messages an
        early end-of-partition event came before, under load, when this read the event
        alone."""
        return all(self._done(tp) for tp in self.at_end)

    def watermark(self) -> float:
        """Events strictly older than this can no longer be preceded by an unread one. A
        partition at an early end-of-partition event still holds it back: released on that
        event alone, a fresh consumer's other partitions wrote later events before the
        messages it then fetched (`test_record_from_a_time_keeps_only_later_events` on a
        loaded machine)."""
        low = float("inf")
        for tp in self.at_end:
            if self._done(tp):
                continue
            seen = self.last_ts[tp]
            if seen is None:
                return float("-inf")
            low = min(low, seen)
        return low

    def pop_until(self, limit: float) -> list[tuple[int, str, str | None, Event]]:
        out = []
        heap = self.heap
        while heap and heap[0][0] < limit:
            ts, _, _, _, _, topic, key, value = heapq.heappop(heap)
            out.append((ts, topic, key, value))
        return out


def record_log(kafka: KafkaSettings, out: str | Path, *, topics: tuple[str, ...] = TOPICS,
               start: StartAt = StartAt(), duration_s: float | None = None,
               stop_at_end: bool = False, max_buffer: int = 1_000_000,
               progress: bool = False,
               should_stop: Callable[[], bool] = lambda: False) -> RecordStats:
    """Tap ``topics`` into the log at ``out``; see the module docstring for order and stops."""
    for topic in topics:
        if topic not in VALUE_TYPES:
            raise ValueError(f"unknown log topic {topic!r}; known: {', '.join(TOPICS)}")
    consumer = kafka_clients.consumer(kafka, f"surplus-record-{uuid.uuid4().hex[:12]}", **{
        "enable.auto.commit": False,
        "enable.auto.offset.store": False, "enable.partition.eof": True,
        "auto.offset.reset": "earliest" if start.kind != "end" else "latest",
        "client.id": "surplus-record"})
    stats = RecordStats()
    meter = Progress(f"record {Path(out).name}", enabled=progress)
    started = time.monotonic()
    names = {kafka.topic(topic): topic for topic in topics}
    codecs = {topic: codec_for(VALUE_TYPES[topic]) for topic in topics}
    try:
        assignment = _assignment(consumer, list(names), start)
        stats.partitions = len(assignment)
        merge = _Merge([(names[tp.topic], tp.partition) for tp in assignment],
                       _ends(consumer, assignment, names) if stop_at_end else None)
        consumer.assign(assignment)
        with EventLogWriter(out, strict_order=False) as writer:
            try:
                while True:
                    if should_stop():
                        stats.stopped = "stopped"
                        break
                    if duration_s is not None and time.monotonic() - started >= duration_s:
                        stats.stopped = "duration"
                        break
                    for msg in consumer.consume(num_messages=2000, timeout=0.2):
                        _take(msg, names, codecs, merge, stats)
                    if stop_at_end and merge.caught_up():
                        stats.stopped = "caught_up"
                        break
                    limit = merge.watermark()
                    if len(merge.heap) > max_buffer:
                        limit = max(limit, merge.heap[len(merge.heap) // 2][0])
                    _write(writer, merge.pop_until(limit), stats)
                    meter.update(f"{stats.events:,} events written, {len(merge.heap):,} "
                                 f"buffered")
            except KeyboardInterrupt:
                stats.stopped = "interrupted"
            _write(writer, merge.pop_until(float("inf")), stats)
            stats.out_of_order = writer.out_of_order
    except KafkaException as exc:
        raise LiveError(f"consuming from {kafka.bootstrap} failed: {exc}") from None
    finally:
        consumer.close()
    stats.seconds = time.monotonic() - started
    meter.done(f"{stats.events:,} events -> {out} ({stats.stopped})")
    return stats


def _ends(consumer: Consumer, assignment: list[TopicPartition],
          names: dict[str, str]) -> dict[tuple[str, int], tuple[int, int]]:
    """(start offset, end offset) of each assigned partition, asked of the broker now."""
    out = {}
    for tp in assignment:
        low, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition),
                                                   timeout=10.0)
        start = (low if tp.offset == OFFSET_BEGINNING else high if tp.offset == OFFSET_END
                 else tp.offset)
        out[(names[tp.topic], tp.partition)] = (start, high)
    return out


def _assignment(consumer: Consumer, topics: list[str], start: StartAt) -> list[TopicPartition]:
    """Every partition of ``topics`` with its start offset."""
    parts: list[tuple[str, int]] = []
    for name in topics:
        try:
            parts += [(name, p) for p in kafka_clients.partitions(consumer, name, 10.0)]
        except kafka_clients.TopicUnavailable as exc:
            raise LiveError(str(exc)) from None
    if start.kind == "beginning":
        return [TopicPartition(topic, p, OFFSET_BEGINNING) for topic, p in parts]
    if start.kind == "end":
        return [TopicPartition(topic, p, OFFSET_END) for topic, p in parts]
    if start.kind == "time":
        return kafka_clients.starting_at_time(consumer, parts, start.value, timeout_s=10.0)
    out = []
    for topic, p in parts:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10.0)
        out.append(TopicPartition(topic, p, min(max(start.value, low), high)))
    return out


def _take(msg: Any, names: dict[str, str], codecs: dict[str, Any], merge: _Merge,
          stats: RecordStats) -> None:
    """One consumed message (or partition-EOF notice) into the merge buffer."""
    err = msg.error()
    topic = names.get(msg.topic())
    if err is not None:
        if kafka_clients.is_partition_eof(err) and topic is not None:
            merge.eof(topic, msg.partition())
            return
        raise LiveError(f"consumer error on {msg.topic()}[{msg.partition()}]: {err}")
    if topic is None:
        return
    merge.consumed(topic, msg.partition(), msg.offset())
    try:
        # A telemetry message may carry a batch of reports; the log holds one per line.
        # So may an outcomes message (a client's batch of decision records).
        values = (decode_telemetry(msg.value()) if topic == "telemetry"
                  else decode_outcomes(msg.value()) if topic == "outcomes"
                  else decode_labels(msg.value()) if topic == "labels"
                  else [codecs[topic].decode(msg.value())])
    except ContractError as exc:
        reason = f"{topic}: {exc.reason}"[:120]
        stats.invalid[reason] = stats.invalid.get(reason, 0) + 1
        return
    raw_key = msg.key()
    key = raw_key.decode("utf-8", errors="replace") if raw_key is not None else None
    _, ts = msg.timestamp()
    for value in values:
        merge.push(topic, msg.partition(), msg.offset(), max(0, ts), key, value)


def _write(writer: EventLogWriter, events: list[tuple[int, str, str | None, Event]],
           stats: RecordStats) -> None:
    for ts, topic, key, value in events:
        writer.write_value(ts, topic, key, value)
        stats.events += 1
        stats.by_topic[topic] = stats.by_topic.get(topic, 0) + 1


def same_events(a: list[AnyEvent], b: list[AnyEvent]) -> str | None:
    """None when two event lists are equal (order and content); else where they first differ."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"event {i} differs: {x!r} != {y!r}"
    if len(a) != len(b):
        return f"lengths differ: {len(a)} != {len(b)}"
    return None


__all__ = ["EventLogError", "LiveError", "PublishStats", "RecordStats", "StartAt",
           "parse_time_ms", "publish_log", "record_log", "same_events", "shift_value"]
