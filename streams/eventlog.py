"""The event log: what flowed through Surplus's topics, one JSON object per line, in time order.

    {"ts": 1700000000000, "topic": "telemetry", "key": "eu1", "value": {...WindowReport...}}

``ts`` is the event time in ms since the epoch (the Kafka message timestamp when recorded),
``topic`` the *logical* topic (``telemetry|capacity|preemption|targets|outcomes|overrides|
labels|estimates``), ``key`` the message key (the scope; a label's request id), ``value``
the contract's JSON for that topic. A path ending
in ``.zst`` is zstd-compressed. Logs are written by ``surplus record`` and by the simulator, and
read by the offline replayer, the live replayer and the benchmark.

Reading is on the hot path of offline replay (>= 200,000 events/s on one core), so each line is
decoded by *one* msgspec call into a typed event (a tagged union on ``topic``): no ``json.loads``,
no dict, no second pass. Only a line that fails takes the slow path, which decodes the envelope
and then the value through ``schemas.codec`` so the reason names the field exactly as every other
consumer of the contract would. Bad lines carry their line number; a strict reader stops at the
first, a lenient one counts and skips them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import IO, Any, ClassVar

import msgspec

from schemas.codec import SUPPORTED_VERSIONS, ContractError, codec_for
from schemas.contract import (
    CapacityEvent,
    ControlTargets,
    Event,
    LiftReport,
    OperatorOverride,
    OutcomeLabel,
    PreemptionNotice,
    RoutingOutcome,
    TimestampMs,
    WindowReport,
)

TOPICS: tuple[str, ...] = ("telemetry", "capacity", "preemption", "targets", "outcomes",
                           "overrides", "labels", "estimates")
"""Logical topics an event log may hold, in the order used to break timestamp ties."""

MAX_LINE_BYTES = 1 << 20
MAX_REPORTED_ERRORS = 100


class LogEvent(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
               tag_field="topic"):
    """One line of an event log. Subclasses fix ``topic`` and the type of ``value``."""

    topic: ClassVar[str]
    ts: TimestampMs
    key: str | None = None
    value: Event


class TelemetryEvent(LogEvent, frozen=True, kw_only=True, tag="telemetry"):
    topic: ClassVar[str] = "telemetry"
    value: WindowReport


class CapacityLogEvent(LogEvent, frozen=True, kw_only=True, tag="capacity"):
    topic: ClassVar[str] = "capacity"
    value: CapacityEvent


class PreemptionEvent(LogEvent, frozen=True, kw_only=True, tag="preemption"):
    topic: ClassVar[str] = "preemption"
    value: PreemptionNotice


class TargetsEvent(LogEvent, frozen=True, kw_only=True, tag="targets"):
    topic: ClassVar[str] = "targets"
    value: ControlTargets


class OutcomeEvent(LogEvent, frozen=True, kw_only=True, tag="outcomes"):
    topic: ClassVar[str] = "outcomes"
    value: RoutingOutcome


class OverrideEvent(LogEvent, frozen=True, kw_only=True, tag="overrides"):
    topic: ClassVar[str] = "overrides"
    value: OperatorOverride


class LabelLogEvent(LogEvent, frozen=True, kw_only=True, tag="labels"):
    topic: ClassVar[str] = "labels"
    value: OutcomeLabel


class EstimatesEvent(LogEvent, frozen=True, kw_only=True, tag="estimates"):
    topic: ClassVar[str] = "estimates"
    value: LiftReport


AnyEvent = (TelemetryEvent | CapacityLogEvent | PreemptionEvent | TargetsEvent | OutcomeEvent
            | OverrideEvent | LabelLogEvent | EstimatesEvent)

EVENT_CLASSES: dict[str, type[LogEvent]] = {
    cls.topic: cls
    for cls in (TelemetryEvent, CapacityLogEvent, PreemptionEvent, TargetsEvent, OutcomeEvent,
                OverrideEvent, LabelLogEvent, EstimatesEvent)
}
VALUE_TYPES: dict[str, type[Event]] = {
    "telemetry": WindowReport, "capacity": CapacityEvent, "preemption": PreemptionNotice,
    "targets": ControlTargets, "outcomes": RoutingOutcome, "overrides": OperatorOverride,
    "labels": OutcomeLabel, "estimates": LiftReport,
}
TOPIC_ORDER: dict[str, int] = {topic: i for i, topic in enumerate(TOPICS)}


def make_event(ts: int, topic: str, key: str | None, value: Event) -> AnyEvent:
    """A typed log event; raises KeyError naming the topic when it is not a log topic."""
    try:
        cls = EVENT_CLASSES[topic]
    except KeyError:
        raise KeyError(f"unknown log topic {topic!r}; known: {', '.join(TOPICS)}") from None
    return cls(ts=ts, key=key, value=value)  # type: ignore[return-value]


class BadLine(msgspec.Struct, frozen=True):
    """A line that is not a valid event, and why (the reason names the field)."""

    line: int
    reason: str


class EventLogError(ValueError):
    """A strict reader met a bad line, or a log cannot be opened or written."""

    def __init__(self, path: str | Path, line: int | None, reason: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {reason}")
        self.path = str(path)
        self.line = line
        self.reason = reason


# -- decoding -----------------------------------------------------------------------------------

_decoder = msgspec.json.Decoder(AnyEvent)


class _Envelope(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The slow path's view of a line: the value stays raw until its codec explains it."""

    ts: TimestampMs
    topic: str
    key: str | None = None
    value: msgspec.Raw


_envelope_decoder = msgspec.json.Decoder(_Envelope)


def explain(line: bytes) -> str:
    """Why ``line`` is not a valid event (only called for lines the fast path refused)."""
    if len(line) > MAX_LINE_BYTES:
        return f"line of {len(line)} bytes exceeds the {MAX_LINE_BYTES}-byte limit"
    try:
        envelope = _envelope_decoder.decode(line)
    except msgspec.ValidationError as exc:
        return f"envelope: {exc}"
    except msgspec.DecodeError as exc:
        return f"malformed JSON ({exc})"
    except RecursionError:
        return "JSON nested too deeply"
    if envelope.topic not in VALUE_TYPES:
        return f"unknown topic {envelope.topic!r} at `$.topic` (known: {', '.join(TOPICS)})"
    try:
        codec_for(VALUE_TYPES[envelope.topic]).decode(bytes(envelope.value))
    except ContractError as exc:
        return f"{envelope.topic} value: {exc}"
    return "not a valid event"  # pragma: no cover - the fast path accepts what the codec does


def decode_line(line: bytes) -> AnyEvent:
    """One line -> one typed event; ContractError (naming the field) when it is not valid."""
    try:
        event: AnyEvent = _decoder.decode(line)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        raise ContractError("event", explain(line)) from None
    if event.value.v not in SUPPORTED_VERSIONS:
        raise ContractError("event", f"{event.topic} value: unknown schema version "
                                     f"{event.value.v} at `$.v`")
    return event


class TruncatedLog(OSError):
    """A compressed log ends inside a zstd frame: the file was cut short."""


def iter_lines(path: str | Path) -> Iterator[bytes]:
    """The log's lines (with newlines), decompressing ``.zst`` transparently.

    A zstd log is read frame by frame, so a file cut inside a frame raises ``TruncatedLog``
    after the lines that could be recovered, instead of ending quietly short.
    """
    path = Path(path)
    with path.open("rb") as raw:
        if path.suffix != ".zst":
            yield from raw
            return
        yield from _zst_lines(raw)


def _zst_lines(raw: IO[bytes]) -> Iterator[bytes]:
    import zstandard

    dctx = zstandard.ZstdDecompressor()
    frame = dctx.decompressobj()
    partial = b""
    in_frame = False
    while chunk := raw.read(1 << 20):
        while chunk:
            try:
                data = frame.decompress(chunk)
            except zstandard.ZstdError as exc:
                raise TruncatedLog(f"corrupt zstd data: {exc}") from None
            in_frame = True
            chunk = b""
            if frame.eof:
                chunk, in_frame = frame.unused_data, False
                frame = dctx.decompressobj()
            if data:
                lines = (partial + data).splitlines(keepends=True)
                partial = lines.pop() if not lines[-1].endswith(b"\n") else b""
                yield from lines
    if partial:
        yield partial
    if in_frame:
        raise TruncatedLog("the zstd stream ends inside a frame (file cut short)")


class EventLogReader:
    """Iterates the typed events of a log, in file order.

    After (or during) iteration: ``lines`` read, ``events`` yielded, ``bad_lines`` skipped,
    ``errors`` (the first 100 bad lines with their reasons), ``out_of_order`` (events older
    than one before them; yielded, since only the reader of a tapped live stream can tell).
    ``strict=True`` raises ``EventLogError`` at the first bad line instead.
    """

    def __init__(self, path: str | Path, *, strict: bool = False) -> None:
        self.path = Path(path)
        self.strict = strict
        self.lines = 0
        self.events = 0
        self.bad_lines = 0
        self.out_of_order = 0
        self.errors: list[BadLine] = []
        self.bytes_read = 0
        if not self.path.is_file():
            raise EventLogError(self.path, None, "no such file")

    def __iter__(self) -> Iterator[AnyEvent]:
        decode = _decoder.decode
        versions = SUPPORTED_VERSIONS
        last_ts = -1
        number = 0
        lines: Iterator[bytes] | IO[bytes]
        raw = self.path.open("rb")
        lines = _zst_lines(raw) if self.path.suffix == ".zst" else raw
        try:
            for number, line in enumerate(lines, 1):
                try:
                    event: AnyEvent = decode(line)
                except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
                    if line.strip():
                        self._bad(number, explain(line))
                    continue
                if event.value.v not in versions:
                    self._bad(number, f"{event.topic} value: unknown schema version "
                                      f"{event.value.v} at `$.v`")
                    continue
                if event.ts < last_ts:
                    self.out_of_order += 1
                else:
                    last_ts = event.ts
                self.events += 1
                yield event
        except OSError as exc:  # a truncated or corrupt compressed stream
            self._bad(number + 1, f"unreadable: {exc}")
        finally:
            self.lines = number
            raw.close()

    def _bad(self, number: int, reason: str) -> None:
        if self.strict:
            raise EventLogError(self.path, number, reason)
        self.bad_lines += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(BadLine(number, reason))

    def stats(self) -> dict[str, Any]:
        """What the read saw (JSON-ready, stable key order)."""
        return {"lines": self.lines, "events": self.events, "bad_lines": self.bad_lines,
                "out_of_order": self.out_of_order,
                "errors": [{"line": e.line, "reason": e.reason} for e in self.errors]}


def read_events(path: str | Path, *, strict: bool = False) -> EventLogReader:
    """A reader over ``path``; iterate it for typed events (see ``EventLogReader``)."""
    return EventLogReader(path, strict=strict)


# -- encoding -----------------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()


def encode_line(ts: int, topic: str, key: str | None, value: Event) -> bytes:
    """One log line (with its newline), fields in the documented order."""
    if topic not in VALUE_TYPES:
        raise KeyError(f"unknown log topic {topic!r}; known: {', '.join(TOPICS)}")
    key_json = b"null" if key is None else _encoder.encode(key)
    return b'{"ts":%d,"topic":"%s","key":%s,"value":%s}\n' % (
        ts, topic.encode(), key_json, _encoder.encode(value))


class EventLogWriter:
    """Writes events as lines; ``.zst`` paths are zstd-compressed. Use as a context manager.

    With ``strict_order`` (the default) an event older than the previous one raises
    ``EventLogError``: a log is in time order by definition. A recorder tapping live topics,
    where a producer's clock may lag, passes ``strict_order=False`` and reads ``out_of_order``.
    """

    def __init__(self, path: str | Path, *, strict_order: bool = True,
                 zstd_level: int = 3) -> None:
        self.path = Path(path)
        self.strict_order = strict_order
        self.events = 0
        self.out_of_order = 0
        self.last_ts = -1
        self.path.parent.mkdir(parents=True, exist_ok=True)
        raw = self.path.open("wb")
        self._raw = raw
        self._stream: IO[bytes]
        if self.path.suffix == ".zst":
            import zstandard

            self._stream = zstandard.ZstdCompressor(level=zstd_level).stream_writer(
                raw, closefd=False)
        else:
            self._stream = raw
        self._buffer: list[bytes] = []

    def write(self, event: LogEvent) -> None:
        self.write_value(event.ts, event.topic, event.key, event.value)

    def write_value(self, ts: int, topic: str, key: str | None, value: Event) -> None:
        if ts < self.last_ts:
            if self.strict_order:
                raise EventLogError(self.path, self.events + 1,
                                    f"event at ts {ts} is older than the previous one "
                                    f"({self.last_ts}); a log is in time order")
            self.out_of_order += 1
        else:
            self.last_ts = ts
        self._buffer.append(encode_line(ts, topic, key, value))
        self.events += 1
        if len(self._buffer) >= 4096:
            self.flush()

    def flush(self) -> None:
        if self._buffer:
            self._stream.write(b"".join(self._buffer))
            self._buffer.clear()

    def close(self) -> None:
        if self._raw.closed:
            return
        self.flush()
        if self._stream is not self._raw:
            self._stream.close()  # ends the zstd frame
        self._raw.close()

    def __enter__(self) -> EventLogWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def write_events(path: str | Path, events: list[AnyEvent] | Iterator[AnyEvent]) -> int:
    """Write ``events`` (in time order) to ``path``; returns how many were written."""
    with EventLogWriter(path) as writer:
        for event in events:
            writer.write(event)
        return writer.events
