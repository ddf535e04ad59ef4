"""The event log format: round trips, compression, bad lines with their line numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.codec import ContractError
from streams.eventlog import (
    EventLogError,
    EventLogWriter,
    TelemetryEvent,
    decode_line,
    encode_line,
    make_event,
    read_events,
)
from tests.unit.control.factories import REGION, report
from tests.unit.replay.helpers import T0, write_small_log


@pytest.mark.parametrize("name", ["log.jsonl", "log.jsonl.zst"])
def test_round_trip_gives_back_the_same_typed_events(tmp_path: Path, name: str) -> None:
    events = write_small_log(tmp_path / name)
    reader = read_events(tmp_path / name)
    assert list(reader) == events
    assert reader.events == len(events) and reader.bad_lines == 0


def test_zst_log_is_really_compressed(tmp_path: Path) -> None:
    write_small_log(tmp_path / "a.jsonl")
    write_small_log(tmp_path / "a.jsonl.zst")
    plain, packed = (tmp_path / "a.jsonl").stat().st_size, (tmp_path / "a.jsonl.zst").stat().st_size
    assert packed * 4 < plain
    assert (tmp_path / "a.jsonl.zst").read_bytes()[:4] == b"\x28\xb5\x2f\xfd"  # zstd magic


def test_line_has_the_documented_field_order() -> None:
    line = encode_line(T0, "telemetry", REGION, report())
    assert line.startswith(b'{"ts":%d,"topic":"telemetry","key":"eu1","value":{' % T0)
    assert line.endswith(b"}\n")
    assert isinstance(decode_line(line), TelemetryEvent)


def _log_with_bad_lines(path: Path) -> None:
    good = encode_line(T0, "telemetry", REGION, report())
    bad_type = good.replace(b'"requests":100', b'"requests":"100"')
    bad_version = good.replace(b'"v":2', b'"v":99')
    path.write_bytes(good + bad_type + b"\n" + b"not json\n" + bad_version
                     + b'{"ts":1,"topic":"gossip","key":null,"value":{}}\n' + good)


def test_lenient_reader_counts_and_skips_bad_lines_with_their_numbers(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    _log_with_bad_lines(path)
    reader = read_events(path)
    assert len(list(reader)) == 2
    assert reader.bad_lines == 4
    assert [e.line for e in reader.errors] == [2, 4, 5, 6]   # line 3 is blank: not an event
    reasons = [e.reason for e in reader.errors]
    assert "`$.requests`" in reasons[0] and "telemetry value" in reasons[0]
    assert "malformed JSON" in reasons[1]
    assert "unknown schema version 99" in reasons[2]
    assert "unknown topic 'gossip'" in reasons[3]


def test_strict_reader_stops_at_the_first_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    _log_with_bad_lines(path)
    reader = read_events(path, strict=True)
    seen = []
    with pytest.raises(EventLogError) as err:
        for event in reader:
            seen.append(event)
    assert len(seen) == 1
    assert err.value.line == 2 and str(err.value).startswith(f"{path}:2: ")


def test_decode_line_names_the_missing_field() -> None:
    line = encode_line(T0, "telemetry", REGION, report()).replace(b'"pool_id":', b'"pool":')
    with pytest.raises(ContractError, match="pool"):
        decode_line(line)


def test_writer_refuses_events_out_of_time_order_unless_told(tmp_path: Path) -> None:
    with EventLogWriter(tmp_path / "a.jsonl") as writer:
        writer.write(make_event(T0 + 5, "telemetry", REGION, report()))
        with pytest.raises(EventLogError, match="time order"):
            writer.write(make_event(T0, "telemetry", REGION, report()))
    with EventLogWriter(tmp_path / "b.jsonl", strict_order=False) as writer:
        writer.write(make_event(T0 + 5, "telemetry", REGION, report()))
        writer.write(make_event(T0, "telemetry", REGION, report()))
    assert writer.out_of_order == 1
    reader = read_events(tmp_path / "b.jsonl")
    assert len(list(reader)) == 2 and reader.out_of_order == 1


def test_missing_log_is_an_error_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(EventLogError, match="no such file"):
        read_events(tmp_path / "nope.jsonl")


def test_truncated_zstd_log_reports_the_damage(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.zst"
    events = write_small_log(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    reader = read_events(path)
    got = list(reader)
    assert len(got) < len(events)
    assert reader.bad_lines == 1 and "unreadable" in reader.errors[0].reason
    with pytest.raises(EventLogError, match="unreadable"):
        list(read_events(path, strict=True))
