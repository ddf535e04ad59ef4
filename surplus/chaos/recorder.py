"""What the nemesis did, kept as history records while it runs.

Faults overlap, each on a thread of its own, so the records are appended under a lock; the
run reads them back (`surplus.chaos.run`) and the checker judges them with the requests.
"""

from __future__ import annotations

import threading

from surplus.chaos import history as h


class Recorder:
    """What the nemesis did, as history records (appended from its threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[h.Record] = []

    def add(self, record: h.Record) -> None:
        with self.lock:
            self.records.append(record)

    def of(self, kind: type[h.Record]) -> list[h.Record]:
        with self.lock:
            return [r for r in self.records if isinstance(r, kind)]
