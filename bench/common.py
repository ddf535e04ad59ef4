"""What benchmarks share: a broker to talk to ($KAFKA_BOOTSTRAP_SERVERS or a local one)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from surplus import localkafka


@contextmanager
def broker(workdir: Path) -> Iterator[str]:
    """A bootstrap address: the given cluster, or a local KRaft broker for the benchmark."""
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if given:
        yield given
        return
    localkafka.fetch_jars()
    data_dir = workdir / "kafka"
    info, _ = localkafka.up(port=localkafka.free_port(), data_dir=data_dir)
    try:
        yield info.bootstrap
    finally:
        localkafka.down(data_dir)
