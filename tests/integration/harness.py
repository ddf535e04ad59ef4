"""Real processes and real Kafka I/O for integration tests: start/stop, publish, read back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from schemas.codec import decode, encode
from schemas.contract import Event
from schemas.kafka_config import KafkaSettings

E = TypeVar("E", bound=Event)


class Proc:
    """A `surplus` subcommand in its own process group, its output in a log file."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None
                 ) -> None:
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "surplus.cli", *args], stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})})

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group (a crash, not a shutdown)."""
        if self.alive():
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not stop in time."""
        if self.alive():
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
        return int(self.popen.returncode)

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
    producer = Producer(kafka.producer())
    for key, value in items:
        payload = value if isinstance(value, bytes) else encode(value)
        producer.produce(kafka.topic(logical), key=key, value=payload)
    assert producer.flush(10) == 0


class TopicReader:
    """Reads a whole topic from the beginning (all partitions, no group commits) and follows."""

    def __init__(self, kafka: KafkaSettings, logical: str) -> None:
        self.consumer = Consumer(kafka.confluent(**{
            "group.id": f"reader-{os.getpid()}-{time.monotonic_ns()}",
            "enable.auto.commit": False, "auto.offset.reset": "earliest"}))
        topic = kafka.topic(logical)
        meta = self.consumer.list_topics(topic, timeout=10)
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                              for p in meta.topics[topic].partitions])
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
