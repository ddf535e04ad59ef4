"""A chaos failure replays from its seed: the schedule the seed draws, and the nemesis's own
draws within a fault (a storm's notices, a forged target's epoch), are pinned here for seed 7,
the fault suite's short run. A change that moves any of them changes what every recorded
failure replays, so it must change these numbers on purpose."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, cast

import pytest

from schemas import kafka_clients
from schemas.codec import decode, encode
from schemas.contract import ControlTargets, PreemptionNotice
from schemas.kafka_config import KafkaSettings
from schemas.signing import Keyring
from surplus.chaos.check import FORGED_EPOCH
from surplus.chaos.nemesis import Nemesis, Recorder
from surplus.chaos.schedule import Fault, ScheduleConfig, draw
from surplus.fleet.procs import POWERFUL_POOL, RMA_POOL
from tests.unit.policy.helpers import targets

SEED = 7
#: The fault suite's short run (tests/faults/test_chaos.py).
SHORT_RUN = ScheduleConfig(mean_gap_s=5.0, warmup_s=5.0, cooldown_s=25.0)
SEED_7_SHORT_RUN = [
    (6.957, "broker_pause", "3", 2.29, ""),
    (15.566, "broker_pause", "3", 2.348, ""),
    (19.107, "broker_kill", "2", 9.182, ""),
    (20.483, "net_cut", "b1", 6.961, ""),
    (21.144, "control_kill", "cp", 3.51, ""),
    (35.899, "net_cut", "b2", 2.298, ""),
    (37.927, "broker_pause", "2", 5.362, ""),
    (43.655, "broker_pause", "3", 5.833, ""),
    (45.985, "net_cut", "b1", 5.386, ""),
    (50.81, "net_delay", "p1", 5.993, "200"),
    (53.943, "forge", "kafka", 0.0, "capacity:unsigned"),
    (59.946, "control_kill", "cp", 3.298, ""),
    (63.67, "reorder", "kafka", 0.0, ""),
    (65.368, "forge", "kafka", 0.0, "overrides:unsigned"),
    (72.444, "broker_pause", "2", 4.53, ""),
    (88.798, "broker_kill", "3", 10.73, ""),
    (99.214, "worker_kill", "p1", 4.101, ""),
    (102.647, "duplicate", "kafka", 0.0, ""),
    (103.451, "notice_storm", "kafka", 2.294, "6"),
]


def test_seed_7_draws_the_same_schedule() -> None:
    drawn = [(f.at_s, f.kind, f.target, f.hold_s, f.param) for f in draw(SEED, 150.0, SHORT_RUN)]
    assert drawn == SEED_7_SHORT_RUN


class _Producer:
    def __init__(self, sent: list[tuple[str, bytes]]) -> None:
        self.sent = sent

    def produce(self, topic: str, key: bytes, value: bytes, on_delivery: Any) -> None:
        self.sent.append((topic, value))
        on_delivery(None, None)

    def flush(self, _timeout: float) -> int:
        return 0


class _Worker:
    url = "http://127.0.0.1:9"  # nothing listens: the direct POST gets no answer
    port = 9

    def __init__(self) -> None:
        self.killed = False

    def kill(self) -> None:
        self.killed = True


class _Message:
    def __init__(self, value: bytes) -> None:
        self._value = value

    def value(self) -> bytes:
        return self._value


class _Reader:
    def __init__(self, values: list[bytes]) -> None:
        self.messages = [_Message(v) for v in values]


class _Runner:
    def now(self) -> float:
        return 100.0


class _Fleet:
    def __init__(self) -> None:
        self.workers = {"p1": _Worker()}
        self.controls: list[Any] = []
        self.runner = _Runner()
        self.granted: list[str] = []
        self.restarted: list[str] = []

    def grant(self, pool: str) -> None:
        self.granted.append(pool)

    def restart_worker(self, name: str, env: Any = None, timeout_s: float = 0.0, *,
                       draining_ok: bool = False) -> _Worker:
        self.restarted.append(name)
        self.workers[name] = _Worker()
        return self.workers[name]


class _Proxies:
    def set_upstream(self, _name: str, _port: int) -> None:
        return None


def _inject(monkeypatch: pytest.MonkeyPatch, fault: Fault) -> tuple[list[tuple[str, bytes]],
                                                                   _Fleet]:
    sent: list[tuple[str, bytes]] = []
    monkeypatch.setattr(kafka_clients, "producer", lambda *_a, **_k: _Producer(sent))
    fleet, stop = _Fleet(), threading.Event()
    stop.set()  # a fault's hold ends at once
    genuine = encode(targets(coverage=0.5, extra=10, budget=100.0))
    nemesis = Nemesis(cast(Any, fleet), cast(Any, _Proxies()), Recorder(),
                      Keyring({"k": "00" * 32}, "k"), kafka=KafkaSettings(),
                      cluster_dir=Path("/nonexistent"), cluster_port=0, brokers=3,
                      targets=cast(Any, _Reader([genuine])), seed=SEED, t0=0.0, stop=stop,
                      say=lambda _line: None)
    try:
        nemesis.inject(fault)
    finally:
        nemesis.close()
    assert nemesis.errors == []
    return sent, fleet


def test_seed_7_storm_sends_the_same_notices(monkeypatch: pytest.MonkeyPatch) -> None:
    storm = Fault(at_s=103.451, kind="notice_storm", target="kafka", hold_s=2.294, param="6")
    sent, fleet = _inject(monkeypatch, storm)
    notices = [decode(PreemptionNotice, v) for topic, v in sent if topic.endswith("preemption")]
    assert [(n.pool_id, list(n.replicas), n.deadline_ms - n.ts_ms) for n in notices] == [
        (RMA_POOL, [], 0),
        (POWERFUL_POOL, [], 0),
        (POWERFUL_POOL, ["p1"], 500),
        (POWERFUL_POOL, [], 2000),
        (POWERFUL_POOL, [], 0),
        (POWERFUL_POOL, [], 0),
    ]
    assert fleet.granted == [POWERFUL_POOL, RMA_POOL]
    # One notice reclaimed p1 itself: lent again after the grant, it is a new process.
    assert fleet.restarted == ["p1"]


def test_seed_7_forged_target_claims_the_same_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    forge = Fault(at_s=53.943, kind="forge", target="kafka", hold_s=0.0,
                  param="targets:bad_signature")
    sent, _ = _inject(monkeypatch, forge)
    [(topic, value)] = sent
    assert topic.endswith("targets")
    assert decode(ControlTargets, value).epoch - FORGED_EPOCH == 137262
