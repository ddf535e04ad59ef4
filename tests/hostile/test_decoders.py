"""Every decoder of outside input, fuzzed: the contract codec for each event type, the worker's
request and response bodies, the event log reader, and the control plane's stored state.

Whatever the bytes, a decoder returns a valid value or raises its one error type with a message
that says what was wrong (naming the field when the JSON was well formed); it never raises
anything else and never takes long. Oversized payloads are refused before parsing; nesting
beyond any legitimate document is refused without exhausting the stack.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.codec import (
    DEFAULT_MAX_BYTES,
    ContractError,
    codec_for,
    decode,
    decode_telemetry,
    encode,
)
from schemas.contract import Event
from schemas.events import EVENT_TYPES
from streams.control.config import ControlConfig
from streams.eventlog import EventLogReader, decode_line, encode_line
from streams.scopes import ScopeRegistry, StoredScope
from tests.hostile.strategies import HOSTILE_BYTES, JSON, mutated, nested
from tests.integration.worker_support import rank_request
from tests.unit.schemas.samples import SAMPLES
from workers.api import (
    RankResponse,
    ServerState,
    decode_request,
    decode_response,
)
from workers.api import encode as encode_api

FUZZ = settings(max_examples=100, deadline=2000, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
NAMED = re.compile(r"`[^`]+`")  # a backquoted field or JSON path
BY_TYPE: dict[type[Event], Event] = {type(e): e for e in SAMPLES}
RESPONSE = RankResponse(request_id="r1", model="baseline", scores=[0.1, 0.2], scored=2,
                        optional_scored=1, optional_shed=0,
                        server=ServerState(queue_delay_ms=1.0, in_flight=1, shedding_level=0))


def _names_the_problem(message: str) -> bool:
    return bool(NAMED.search(message)) or any(s in message for s in (
        "malformed JSON", "nested too deeply", "exceeds the", "unknown schema version",
        "unknown API version", "Expected `",
        "unknown field `"))  # names it, though a field named ` reads as ```


def _decodes_or_explains(decoder: Any, payload: bytes, type_name: str) -> Any:
    started = time.perf_counter()
    try:
        value = decoder(payload)
    except ContractError as exc:
        assert str(exc).startswith(f"{type_name}: ") and exc.reason, exc
        value = exc
    assert time.perf_counter() - started < 0.5
    return value


# -- the contract codec, one event type at a time ------------------------------------------------


@pytest.mark.parametrize("event_type", EVENT_TYPES, ids=lambda t: t.__name__)
@FUZZ
@given(payload=HOSTILE_BYTES)
def test_codec_takes_any_bytes_without_crashing(event_type: type[Event], payload: bytes) -> None:
    result = _decodes_or_explains(codec_for(event_type).decode, payload, event_type.__name__)
    if not isinstance(result, ContractError):
        assert decode(event_type, encode(result)) == result


@pytest.mark.parametrize("event_type", EVENT_TYPES, ids=lambda t: t.__name__)
@FUZZ
@given(data=st.data())
def test_codec_names_the_field_of_a_mutated_document(event_type: type[Event],
                                                     data: st.DataObject) -> None:
    payload, path, action = data.draw(mutated(BY_TYPE[event_type]))
    result = _decodes_or_explains(codec_for(event_type).decode, payload, event_type.__name__)
    if isinstance(result, ContractError):
        assert _names_the_problem(result.reason), (path, action, result.reason)
    else:  # the change was still within the contract: it round-trips
        assert decode(event_type, encode(result)) == result


@pytest.mark.parametrize("event_type", EVENT_TYPES, ids=lambda t: t.__name__)
def test_codec_refuses_deep_nesting_and_oversize_quickly(event_type: type[Event]) -> None:
    codec = codec_for(event_type)
    for payload in (nested(100_000), nested(100_000, b"{"), nested(600)):
        started = time.perf_counter()
        with pytest.raises(ContractError) as err:
            codec.decode(payload)
        assert time.perf_counter() - started < 0.5
        assert err.value.reason
    huge = b'{"v":1,"pad":"' + b"x" * DEFAULT_MAX_BYTES + b'"}'
    started = time.perf_counter()
    with pytest.raises(ContractError, match="exceeds the"):
        codec.decode(huge)
    assert time.perf_counter() - started < 0.05  # refused before parsing


@FUZZ
@given(payload=HOSTILE_BYTES | st.lists(JSON, max_size=4).map(msgspec.json.encode))
def test_telemetry_batch_decoder_takes_any_bytes(payload: bytes) -> None:
    result = _decodes_or_explains(decode_telemetry, payload, "WindowReport")
    if not isinstance(result, ContractError):
        assert all(decode(type(r), encode(r)) == r for r in result)


@FUZZ
@given(data=st.data(), batch=st.integers(min_value=1, max_value=3))
def test_telemetry_batch_decoder_names_the_field_of_a_mutated_report(
        data: st.DataObject, batch: int) -> None:
    payload, path, action = data.draw(mutated(BY_TYPE[type(SAMPLES[0])]))
    good = encode(SAMPLES[0])
    as_batch = b"[" + b",".join([good] * (batch - 1) + [payload]) + b"]"
    result = _decodes_or_explains(decode_telemetry, as_batch, "WindowReport")
    if isinstance(result, ContractError):
        assert _names_the_problem(result.reason), (path, action, result.reason)
    else:
        assert len(result) == batch


def test_telemetry_batch_decoder_bounds_nesting() -> None:
    for payload in (nested(100_000), b"[" + nested(100_000, b"{") + b"]"):
        with pytest.raises(ContractError, match=r"^WindowReport: "):
            decode_telemetry(payload)


# -- the worker's HTTP bodies --------------------------------------------------------------------


@FUZZ
@given(payload=HOSTILE_BYTES)
def test_request_and_response_decoders_take_any_bytes(payload: bytes) -> None:
    _decodes_or_explains(decode_request, payload, "RankRequest")
    _decodes_or_explains(decode_response, payload, "RankResponse")


@FUZZ
@given(data=st.data())
def test_request_decoder_names_the_field_of_a_mutated_request(data: st.DataObject) -> None:
    payload, path, action = data.draw(mutated(rank_request(3, 2)))
    result = _decodes_or_explains(decode_request, payload, "RankRequest")
    if isinstance(result, ContractError):
        assert _names_the_problem(result.reason), (path, action, result.reason)
    else:
        assert result.base_count <= len(result.candidates)


@FUZZ
@given(data=st.data())
def test_response_decoder_names_the_field_of_a_mutated_response(data: st.DataObject) -> None:
    payload, path, action = data.draw(mutated(RESPONSE))
    result = _decodes_or_explains(decode_response, payload, "RankResponse")
    if isinstance(result, ContractError):
        assert _names_the_problem(result.reason), (path, action, result.reason)
    else:
        assert result.scored == len(result.scores)


def test_http_body_decoders_bound_nesting_and_size() -> None:
    for decoder, name in ((decode_request, "RankRequest"), (decode_response, "RankResponse")):
        for payload in (nested(100_000), nested(100_000, b"{")):
            with pytest.raises(ContractError, match=f"^{name}: "):
                decoder(payload)
        with pytest.raises(ContractError, match="exceeds the 1024-byte limit"):
            decoder(encode_api(rank_request(30, 30)), max_bytes=1024)
    too_many = msgspec.to_builtins(rank_request(1, 0))
    too_many["candidates"] = too_many["candidates"] * 4097
    with pytest.raises(ContractError, match=r"\$\.candidates"):
        decode_request(msgspec.json.encode(too_many))


# -- the event log reader -------------------------------------------------------------------------


@FUZZ
@given(line=HOSTILE_BYTES | st.builds(lambda v: b'{"ts":1,"topic":"telemetry","value":'
                                      + msgspec.json.encode(v) + b"}", JSON))
def test_event_log_line_decoder_takes_any_line(line: bytes) -> None:
    _decodes_or_explains(decode_line, line, "event")


def test_event_log_reader_skips_and_counts_hostile_lines(tmp_path: Path) -> None:
    good = encode_line(1, "telemetry", "eu1", BY_TYPE[type(SAMPLES[0])])
    hostile = [b"\x00\xff garbage\n", b"{}\n", nested(100_000) + b"\n",
               b'{"ts":1,"topic":"telemetry","value":' + nested(50_000) + b"}\n",
               b'{"ts":1,"topic":"nope","value":{}}\n', b"x" * (1 << 20) + b"\n"]
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(good + b"".join(hostile) + good)
    reader = EventLogReader(path)
    events = list(reader)
    assert len(events) == 2 and reader.bad_lines == len(hostile)
    assert all(_names_the_problem(e.reason) or "unknown topic" in e.reason
               for e in reader.errors), reader.errors


# -- the control plane's stored state --------------------------------------------------------------


@FUZZ
@given(raw=HOSTILE_BYTES)
def test_corrupt_stored_state_starts_the_scope_afresh_instead_of_crashing(raw: bytes) -> None:
    registry = ScopeRegistry(ControlConfig())
    skipped = registry.restore({"eu1": raw}, [0])
    entry = registry.get("eu1", 0)  # a controller either way: restored or fresh
    assert entry.controller.scope == "eu1"
    if skipped:
        assert entry.controller.epoch == 0 and "eu1" in registry.skipped


def test_stored_state_of_another_scope_is_not_adopted() -> None:
    donor = ScopeRegistry(ControlConfig())
    donor.get("us2", 0).controller.tick(1_000)
    stolen = msgspec.json.encode(donor.save("us2"))
    registry = ScopeRegistry(ControlConfig())
    assert registry.restore({"eu1": stolen}, [0]) == {}
    entry = registry.get("eu1", 0)
    assert entry.controller.epoch == 0 and "eu1" in registry.skipped
    assert msgspec.json.decode(stolen, type=StoredScope).state.scope == "us2"
