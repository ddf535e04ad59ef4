"""Real processes and real Kafka I/O for integration tests: start/stop, publish, read back."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from schemas import kafka_clients
from schemas.codec import decode, encode
from schemas.contract import Event
from schemas.kafka_clients import OFFSET_BEGINNING
from schemas.kafka_config import KafkaSettings
from surplus.live.procs import Child

E = TypeVar("E", bound=Event)


class Proc(Child):
    """A `surplus` subcommand started at once (the demo's `Child`: own session, log file, dies
    with the test process), with the crash and output helpers tests use."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None
                 ) -> None:
        super().__init__(log_path.stem, args, log_path.parent, env=env)
        self.log_path = log_path
        self.start()

    def kill(self) -> None:
        """SIGKILL the whole process group (a crash, not a shutdown)."""
        self.send(signal.SIGKILL)
        self.wait(10)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        return super().stop(sig, timeout_s)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def running(args: list[str], log_path: Path) -> Iterator[Proc]:
    proc = Proc(args, log_path)
    try:
        yield proc
    finally:
        proc.stop()


def publish(kafka: KafkaSettings, logical: str, items: list[tuple[str | None, Any]]) -> None:
    """Produce (key, event-or-bytes) pairs with the scope-compatible partitioner."""
    producer = kafka_clients.producer(kafka)
    for key, value in items:
        payload = value if isinstance(value, bytes) else encode(value)
        producer.produce(kafka.topic(logical), key=key, value=payload)
    assert producer.flush(10) == 0


class TopicReader:
    """Reads a whole topic from the beginning (all partitions, no group commits) and follows."""

    def __init__(self, kafka: KafkaSettings, logical: str) -> None:
        self.consumer = kafka_clients.consumer(
            kafka, f"reader-{os.getpid()}-{time.monotonic_ns()}",
            **{"enable.auto.commit": False, "auto.offset.reset": "earliest"})
        topic = kafka.topic(logical)
        self.consumer.assign(kafka_clients.starting_at(
            topic, kafka_clients.partitions(self.consumer, topic, timeout_s=10),
            OFFSET_BEGINNING))
        self.messages: list[Any] = []

    def poll(self, seconds: float) -> list[Any]:
        deadline = time.monotonic() + seconds
        new = []
        while time.monotonic() < deadline:
            msg = self.consumer.poll(0.05)
            if msg is not None and msg.error() is None:
                new.append(msg)
        self.messages.extend(new)
        return new

    def wait_for(self, predicate: Callable[[Any], bool], timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        for msg in self.messages:
            if predicate(msg):
                return msg
        while time.monotonic() < deadline:
            for msg in self.poll(0.2):
                if predicate(msg):
                    return msg
        return None

    def events(self, event_type: type[E]) -> list[E]:
        return [decode(event_type, m.value()) for m in self.messages]

    def close(self) -> None:
        self.consumer.close()
