"""Real processes and real Kafka I/O for integration tests: start/stop, publish, read back
(`surplus.fleet.procs`, shared with `surplus chaos`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from surplus.fleet.procs import Proc, TopicReader, publish

__all__ = ["Proc", "TopicReader", "publish", "running"]


@contextmanager
def running(args: list[str], log_path: Path) -> Iterator[Proc]:
    proc = Proc(args, log_path)
    try:
        yield proc
    finally:
        proc.stop()
