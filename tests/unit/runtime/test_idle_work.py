"""Idle work (the precompute lever) in the inference thread: done only while no request is
queued, so a request waits for one slice at most, and stopped by a preemption notice."""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from tests.unit.runtime.test_batching import rows
from workers.policy.admission import Admission, AdmissionConfig
from workers.runtime.batching import Batcher, BatchingConfig, Job, Scorer


class Log:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[str] = []

    def add(self, event: str) -> None:
        with self.lock:
            self.events.append(event)


class Scoring:
    def __init__(self, log: Log) -> None:
        self.log = log

    def score(self, *inputs: np.ndarray) -> np.ndarray:
        self.log.add("request")
        return np.zeros(len(inputs[1]), dtype=np.float32)


class Slices:
    """Endless idle work, one short slice a step."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.halted = False
        self.steps = 0
        self.quota_s = 0.0
        self.stepping = threading.Event()

    def ready_in(self) -> float | None:
        return None if self.halted else 0.0

    def step(self, scorer: Scorer) -> None:
        self.log.add("slice")
        self.steps += 1
        self.stepping.set()
        threading.Event().wait(0.002)
        self.quota_s += 0.002

    def halt(self) -> None:
        self.halted = True


def started(log: Log, work: Slices) -> Batcher:
    """A batcher scoring into ``log``, with ``work`` as its idle work, running."""
    admission: Admission[Job] = Admission(AdmissionConfig(max_queue_delay_ms=60_000.0))
    b = Batcher(Scoring(log), admission, BatchingConfig(max_batch_rows=64, max_wait_ms=0.0))
    b.set_idle_work(work)
    b.start()
    return b


async def slice_after_last_request(log: Log) -> None:
    while True:
        with log.lock:
            events = list(log.events)
        last = len(events) - 1 - events[::-1].index("request")
        if "slice" in events[last + 1:]:
            return
        await asyncio.sleep(0.01)


async def test_a_request_waits_for_at_most_the_slice_in_service() -> None:
    log = Log()
    work = Slices(log)
    b = started(log, work)
    try:
        for _ in range(20):
            await asyncio.to_thread(work.stepping.wait, 10)
            work.stepping.clear()
            log.add("submit")
            await asyncio.wait_for(b.submit_baseline(rows(1.0, 4)), 10)
        events = log.events
        for i, event in enumerate(events):
            if event == "submit":
                served = events.index("request", i)
                assert events[i + 1:served].count("slice") <= 1, events[i:served + 1]
        # and it goes back to filling the time once the last request is served
        await asyncio.wait_for(slice_after_last_request(log), 10)
    finally:
        b.stop()


async def test_a_preemption_halts_idle_work_and_requests_are_still_served() -> None:
    log = Log()
    work = Slices(log)
    b = started(log, work)
    try:
        await asyncio.to_thread(work.stepping.wait, 10)
        b.preempt()
        assert work.halted
        steps = work.steps
        await asyncio.wait_for(b.submit_baseline(rows(1.0, 4)), 10)
        await asyncio.sleep(0.1)
        assert work.steps <= steps + 1  # the slice in service when the notice came, no more
    finally:
        b.stop()
