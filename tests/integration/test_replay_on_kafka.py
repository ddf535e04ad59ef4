"""Record and replay on a real broker: log -> Kafka -> log gives the same events, in order."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from schemas.kafka_config import KafkaSettings
from streams.eventlog import TOPIC_ORDER, AnyEvent, read_events, write_events
from streams.replay_live import publish_log, same_events
from surplus.cli import app
from surplus.topics import apply_topics
from tests.unit.replay.helpers import small_log_events

pytestmark = pytest.mark.kafka

runner = CliRunner()


def _canonical(events: list[AnyEvent]) -> list[AnyEvent]:
    """Ties on the timestamp in the order a recording breaks them (topic, then partition:
    every event here has the same key, so each topic's events share one partition)."""
    return sorted(events, key=lambda e: (e.ts, TOPIC_ORDER[e.topic]))


def _cli(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _record(kafka: KafkaSettings, out: Path, *extra: str) -> list[AnyEvent]:
    _cli("record", "--bootstrap", kafka.bootstrap, "--prefix", kafka.prefix, "--out", str(out),
         "--stop-at-end", "--quiet", *extra)
    reader = read_events(out, strict=True)
    return list(reader)


def test_replay_to_kafka_then_record_gives_back_the_log(kafka: KafkaSettings,
                                                       tmp_path: Path) -> None:
    events = _canonical(small_log_events(seconds=20))
    log = tmp_path / "log.jsonl.zst"
    write_events(log, events)
    output = _cli("replay", str(log), "--to-kafka", "--bootstrap", kafka.bootstrap,
                  "--prefix", kafka.prefix, "--speed", "0", "--quiet")
    assert f"published {len(events)} events" in output
    recorded = _record(kafka, tmp_path / "rec.jsonl")
    assert same_events(recorded, events) is None

    # record -> replay -> record again, into a second namespace of topics
    second = KafkaSettings(bootstrap=kafka.bootstrap, prefix=kafka.prefix + "again.")
    assert apply_topics(second.confluent(), second.prefix, partitions_override=2).ok
    _cli("replay", str(tmp_path / "rec.jsonl"), "--to-kafka", "--bootstrap", second.bootstrap,
         "--prefix", second.prefix, "--speed", "0", "--quiet")
    again = _record(second, tmp_path / "again.jsonl.zst")
    assert same_events(again, recorded) is None


def test_record_from_a_time_keeps_only_later_events(kafka: KafkaSettings,
                                                    tmp_path: Path) -> None:
    events = _canonical(small_log_events(seconds=10))
    write_events(tmp_path / "log.jsonl", events)
    publish_log(tmp_path / "log.jsonl", kafka, speed=0)
    cut = events[len(events) // 2].ts
    recorded = _record(kafka, tmp_path / "rec.jsonl", "--from", f"time:{cut}",
                       "--topics", "telemetry,outcomes")
    expected = [e for e in events if e.ts >= cut and e.topic in ("telemetry", "outcomes")]
    assert same_events(recorded, expected) is None


def test_speed_keeps_inter_arrival_times_scaled(kafka: KafkaSettings, tmp_path: Path) -> None:
    events = _canonical(small_log_events(seconds=10))   # spans 10 s of event time
    write_events(tmp_path / "log.jsonl", events)
    started = time.monotonic()
    stats = publish_log(tmp_path / "log.jsonl", kafka, speed=20.0)
    elapsed = time.monotonic() - started
    assert stats.failed == 0 and stats.delivered == len(events)
    assert elapsed >= 10.0 / 20.0 * 0.95


def test_replay_to_an_unreachable_broker_fails_with_one_line(tmp_path: Path) -> None:
    write_events(tmp_path / "log.jsonl", small_log_events(seconds=2))
    result = runner.invoke(app, ["replay", str(tmp_path / "log.jsonl"), "--to-kafka",
                                 "--bootstrap", "127.0.0.1:1", "--speed", "0", "--quiet",
                                 "--delivery-timeout", "1"])
    assert result.exit_code == 1
    assert result.output.strip().startswith("error:") and "not delivered" in result.output
