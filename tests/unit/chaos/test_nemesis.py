"""The nemesis with its fleet faked: a fault holds what it occupies, heals what it broke, and
is recorded; one that finds its process still healing is recorded as not injected."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any, cast

from schemas.kafka_config import KafkaSettings
from schemas.signing import Keyring
from surplus.chaos import history as h
from surplus.chaos.nemesis import Nemesis, Recorder
from surplus.chaos.schedule import KINDS, Fault


class _Worker:
    def __init__(self) -> None:
        self.signals: list[int] = []

    def send(self, sig: int) -> None:
        self.signals.append(sig)


class _Runner:
    def now(self) -> float:
        return 12.0


class _Fleet:
    def __init__(self) -> None:
        self.workers = {"b1": _Worker()}
        self.controls: list[Any] = [object()]
        self.runner = _Runner()


def _nemesis(fleet: _Fleet, recorder: Recorder) -> Nemesis:
    return Nemesis(cast(Any, fleet), cast(Any, None), recorder,
                   Keyring({"k": "00" * 32}, "k"), kafka=KafkaSettings(),
                   cluster_dir=Path("/nonexistent"), cluster_port=0, brokers=3,
                   targets=cast(Any, None), seed=7, t0=2.0, stop=threading.Event(),
                   say=lambda _line: None)


def test_freeze_stops_and_resumes_the_worker_and_is_recorded() -> None:
    fleet, recorder = _Fleet(), Recorder()
    nemesis = _nemesis(fleet, recorder)
    try:
        nemesis.inject(Fault(at_s=10.0, kind="worker_freeze", target="b1", hold_s=0.01))
    finally:
        nemesis.close()
    assert fleet.workers["b1"].signals == [signal.SIGSTOP, signal.SIGCONT]
    [record] = recorder.of(h.FaultRecord)
    assert isinstance(record, h.FaultRecord)
    assert record.ok and record.kind == "worker_freeze" and record.baseline_path
    assert nemesis.errors == []


def test_fault_on_a_process_still_healing_is_not_injected() -> None:
    fleet, recorder = _Fleet(), Recorder()
    nemesis = _nemesis(fleet, recorder)
    healing = nemesis._lock("baseline")
    healing.acquire()
    try:
        nemesis.inject(Fault(at_s=10.0, kind="worker_freeze", target="b1", hold_s=0.01))
    finally:
        healing.release()
        nemesis.close()
    assert fleet.workers["b1"].signals == []
    [record] = recorder.of(h.FaultRecord)
    assert isinstance(record, h.FaultRecord)
    assert not record.ok and "still healing" in record.detail


def test_every_kind_the_schedule_draws_has_one_injector() -> None:
    nemesis = _nemesis(_Fleet(), Recorder())
    try:
        assert set(nemesis._kinds) == set(KINDS)
    finally:
        nemesis.close()
