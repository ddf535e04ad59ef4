"""The live scheduler sends, message for message, what the simulator publishes for a scenario:
one capacity schedule, stamped at the same moments, gives the same bytes."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from schemas.codec import encode
from schemas.kafka_config import KafkaSettings
from sim import schedule
from sim.engine import Simulation
from streams.eventlog import read_events
from surplus.demo import scheduler as live
from tests.unit.sim.helpers import LENT, lent_scenario


class Clock(threading.Event):
    """A wall clock that waiting moves forward (nothing really waits)."""

    def __init__(self, now_ms: int) -> None:
        super().__init__()
        self.now_ms = now_ms

    def wait(self, timeout: float | None = None) -> bool:
        self.now_ms += round((timeout or 0.0) * 1000)
        return False


class Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bytes]] = []

    def produce(self, topic: str, *, key: str, value: bytes, on_delivery: object) -> None:
        self.sent.append((topic, key, value))

    def flush(self, _timeout: float) -> int:
        return 0


def test_the_live_scheduler_sends_what_the_simulator_publishes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario, base = lent_scenario(tmp_path, LENT.replace("notice_s = 1.0", "notice_s = 1.25"))
    kafka = KafkaSettings(bootstrap="127.0.0.1:1")
    Simulation(scenario, base, "static", tmp_path / "sim").run()
    simulated = [(kafka.topic(e.topic), e.key, encode(e.value))
                 for e in read_events(tmp_path / "sim" / "events.jsonl.zst")
                 if e.topic in ("capacity", "preemption")]

    clock = Clock(scenario.start_ms)
    monkeypatch.setattr(live, "wall_ms", lambda: clock.now_ms)
    sender = live.Scheduler(schedule.build(scenario, base), kafka, scenario.start_ms,
                            say=lambda _line: None)
    producer = sender._producer = Producer()  # type: ignore[assignment]
    stats = sender.run(clock, end_ms=scenario.duration_ms)

    assert producer.sent == simulated
    assert stats.sent["revoke"] == 2  # at the storm's deadline, and the closing one
    assert clock.now_ms == scenario.start_ms + scenario.duration_ms
