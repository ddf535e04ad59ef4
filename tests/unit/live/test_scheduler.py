"""The live scheduler sends, message for message, what the simulator publishes for a scenario:
one capacity schedule, stamped at the same moments, gives the same bytes."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from schemas.codec import encode
from schemas.contract import ReplicaAnnouncement
from schemas.kafka_config import KafkaSettings
from sim import schedule
from sim.engine import Simulation
from streams.eventlog import read_events
from surplus.live import scheduler as live
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
    monkeypatch.setattr(live, "wall_ms_at_edge", lambda: clock.now_ms)  # notices' stamps
    sender = live.Scheduler(schedule.build(scenario, base), kafka, scenario.start_ms,
                            say=lambda _line: None)
    producer = sender._producer = Producer()  # type: ignore[assignment]
    stats = sender.run(clock, end_ms=scenario.duration_ms)

    assert producer.sent == simulated
    assert stats.sent["revoke"] == 2  # at the storm's deadline, and the closing one
    assert clock.now_ms == scenario.start_ms + scenario.duration_ms


class Replica(ThreadingHTTPServer):
    """Stands for a worker's /v1/preempt: keeps what it is posted, answers as a worker does."""

    def __init__(self) -> None:
        posted: list[tuple[str, bytes]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                posted.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b'{"outcome": "applied"}')

            def log_message(self, *_args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.posted = posted
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


def test_each_notice_is_posted_to_the_live_replicas_of_its_pool_as_well_as_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario, base = lent_scenario(tmp_path)
    kafka = KafkaSettings(bootstrap="127.0.0.1:1")
    clock = Clock(scenario.start_ms)
    monkeypatch.setattr(live, "wall_ms", lambda: clock.now_ms)
    monkeypatch.setattr(live, "wall_ms_at_edge", lambda: clock.now_ms)
    actions = schedule.build(scenario, base)
    pool = next(a.pool_id for a in actions if a.kind == "notice")
    replica = Replica()
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    directory = live.ReplicaDirectory(kafka)        # its feed is not started: fed by hand
    named = "eu1-baseline-cpu-opportunistic-1"        # the step down names it; the storm too
    directory._deliver(named, ReplicaAnnouncement(
        replica_id=named, endpoint=replica.url, region="eu1", pool_id=pool,
        tier="opportunistic", model="baseline", state="serving", ts_ms=scenario.start_ms,
        lease_expires_at_ms=scenario.start_ms + 10 * scenario.duration_ms))
    sender = live.Scheduler(actions, kafka, scenario.start_ms, say=lambda _line: None,
                            directory=directory)
    producer = sender._producer = Producer()  # type: ignore[assignment]
    try:
        stats = sender.run(clock, end_ms=scenario.duration_ms)
    finally:
        replica.shutdown()
    sent = [value for topic, _, value in producer.sent if topic == kafka.topic("preemption")]
    assert sent and [p for p, _ in replica.posted] == ["/v1/preempt"] * len(sent)
    # the very notices Kafka carries; posts go out on a pool of threads, in any order
    assert sorted(b for _, b in replica.posted) == sorted(sent)
    assert stats.direct == {"applied": len(sent)}
