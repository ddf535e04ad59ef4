"""Strict JSON codecs for the contract: one error type, and its message names what was wrong.

Decoding never coerces ("5" is not 5), never accepts unknown fields, never accepts a schema
version it does not know, and refuses payloads over a size bound before parsing them.
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, TypeVar

import msgspec

from schemas.contract import (
    READABLE_VERSIONS,
    Event,
    OutcomeLabel,
    RoutingOutcome,
    WindowReport,
)
from schemas.events import EVENT_TYPES

E = TypeVar("E", bound=Event)

DEFAULT_MAX_BYTES = 1 << 20
SUPPORTED_VERSIONS = READABLE_VERSIONS


class ContractError(ValueError):
    """A payload does not satisfy the contract. `reason` is short and names the field."""

    def __init__(self, type_name: str, reason: str) -> None:
        super().__init__(f"{type_name}: {reason}")
        self.type_name = type_name
        self.reason = reason


class _VersionProbe(msgspec.Struct):
    v: Any = None


_probe_decoder = msgspec.json.Decoder(_VersionProbe)
_encoder = msgspec.json.Encoder()


class Codec(Generic[E]):
    """Encode/decode one event type. Reuse instances: msgspec decoders are built once."""

    def __init__(self, event_type: type[E], max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.event_type = event_type
        self.max_bytes = max_bytes
        self._decoder = msgspec.json.Decoder(event_type, strict=True)

    def encode(self, event: E) -> bytes:
        return _encoder.encode(event)

    def decode(self, payload: bytes | bytearray | memoryview | str) -> E:
        name = self.event_type.__name__
        if payload is None:
            raise ContractError(name, "empty payload (null value)")
        if isinstance(payload, str):
            payload = payload.encode()
        if len(payload) > self.max_bytes:
            raise ContractError(name, f"payload of {len(payload)} bytes exceeds the "
                                      f"{self.max_bytes}-byte limit")
        try:
            event = self._decoder.decode(payload)
        except msgspec.ValidationError as exc:
            raise ContractError(name, self._explain(payload, str(exc))) from None
        except msgspec.DecodeError as exc:
            raise ContractError(name, f"malformed JSON ({exc})") from None
        except RecursionError:
            raise ContractError(name, "JSON nested too deeply") from None
        if event.v not in SUPPORTED_VERSIONS:
            raise ContractError(name, f"unknown schema version {event.v} at `$.v` "
                                      f"(supported: {sorted(SUPPORTED_VERSIONS)})")
        return event

    @staticmethod
    def _explain(payload: bytes | bytearray | memoryview, detail: str) -> str:
        """Prefer 'unknown schema version' over a field error when the version is the cause."""
        try:
            version = _probe_decoder.decode(payload).v
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return detail
        if isinstance(version, int) and version not in SUPPORTED_VERSIONS:
            return (f"unknown schema version {version} at `$.v` "
                    f"(supported: {sorted(SUPPORTED_VERSIONS)})")
        return detail


_CODECS: dict[type[Event], Codec[Any]] = {t: Codec(t) for t in EVENT_TYPES}


def codec_for(event_type: type[E]) -> Codec[E]:
    """The shared codec of an event type."""
    return _CODECS[event_type]


TELEMETRY_BATCH_MAX = 10_000
TELEMETRY_MAX_BYTES = 16 << 20
_telemetry_decoder = msgspec.json.Decoder(
    WindowReport | Annotated[list[WindowReport], msgspec.Meta(max_length=TELEMETRY_BATCH_MAX)],
    strict=True)


def decode_telemetry(payload: bytes | bytearray | memoryview | str) -> list[WindowReport]:
    """A telemetry value: one WindowReport (a JSON object) or a batch of them (a JSON array).

    A worker sends its own report as an object. A host or relay that speaks for many replicas
    sends an array, so the control plane pays its per-message cost once per batch; every
    report in it is checked as strictly as a single one.
    """
    return _decode_batch(WindowReport, _telemetry_decoder, payload)


OUTCOMES_BATCH_MAX = 10_000
_outcomes_decoder = msgspec.json.Decoder(
    RoutingOutcome
    | Annotated[list[RoutingOutcome], msgspec.Meta(max_length=OUTCOMES_BATCH_MAX)],
    strict=True)


_labels_decoder = msgspec.json.Decoder(
    OutcomeLabel | Annotated[list[OutcomeLabel], msgspec.Meta(max_length=OUTCOMES_BATCH_MAX)],
    strict=True)


def decode_outcomes(payload: bytes | bytearray | memoryview | str) -> list[RoutingOutcome]:
    """An outcomes value: one decision record (a JSON object) or a client's batch of them (a
    JSON array), each checked as strictly as a single one. A busy client sends batches, so
    the control plane pays its per-message cost once per batch, not once per request."""
    return _decode_batch(RoutingOutcome, _outcomes_decoder, payload)


def decode_labels(payload: bytes | bytearray | memoryview | str) -> list[OutcomeLabel]:
    """A labels value: one OutcomeLabel (keyed by its request id) or a batch of labels of one
    scope (a JSON array, keyed by the scope), as strictly as `decode_outcomes`."""
    return _decode_batch(OutcomeLabel, _labels_decoder, payload)


def _decode_batch(event_type: type[E], decoder: msgspec.json.Decoder[Any],
                  payload: bytes | bytearray | memoryview | str) -> list[E]:
    name = event_type.__name__
    if payload is None:
        raise ContractError(name, "empty payload (null value)")
    if isinstance(payload, str):
        payload = payload.encode()
    elif isinstance(payload, memoryview):
        payload = payload.tobytes()
    if len(payload) > TELEMETRY_MAX_BYTES:
        raise ContractError(name, f"payload of {len(payload)} bytes exceeds the "
                                  f"{TELEMETRY_MAX_BYTES}-byte limit")
    if len(payload) <= DEFAULT_MAX_BYTES and payload.lstrip()[:1] != b"[":
        return [codec_for(event_type).decode(payload)]
    try:
        decoded = decoder.decode(payload)
    except msgspec.ValidationError as exc:
        raise ContractError(name, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise ContractError(name, f"malformed JSON ({exc})") from None
    except RecursionError:
        raise ContractError(name, "JSON nested too deeply") from None
    records = decoded if isinstance(decoded, list) else [decoded]
    for i, record in enumerate(records):
        if record.v not in SUPPORTED_VERSIONS:
            raise ContractError(name, f"unknown schema version {record.v} at `$[{i}].v`")
    return records


def encode_outcomes(records: list[RoutingOutcome] | list[OutcomeLabel]) -> bytes:
    """A batch of decision records (or of labels) as one value (a JSON array)."""
    return _encoder.encode(records)


def encode_telemetry(reports: list[WindowReport]) -> bytes:
    """A batch of reports as one telemetry value (a JSON array)."""
    return _encoder.encode(reports)


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def decode(event_type: type[E], payload: bytes | bytearray | memoryview | str) -> E:
    return codec_for(event_type).decode(payload)


def to_builtins(event: Event) -> Any:
    """The JSON-shaped dict of an event (for event logs and reports)."""
    return msgspec.to_builtins(event)


def from_builtins(event_type: type[E], obj: Any) -> E:
    """Strict conversion of an already-parsed JSON value into an event."""
    name = event_type.__name__
    try:
        event = msgspec.convert(obj, event_type, strict=True)
    except msgspec.ValidationError as exc:
        raise ContractError(name, str(exc)) from None
    if event.v not in SUPPORTED_VERSIONS:
        raise ContractError(name, f"unknown schema version {event.v} at `$.v`")
    return event
