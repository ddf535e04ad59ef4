"""The live worker's telemetry window: the shared report rule (``workers.policy.window``) behind
a lock, since request handlers record on the event loop while the publisher closes windows
from its own thread."""

from __future__ import annotations

import threading

from schemas.contract import WindowReport
from workers.policy.window import Identity, LoadTotals, ReportWindow

__all__ = ["Identity", "LoadTotals", "TelemetryWindow"]


class TelemetryWindow:
    """Thread-safe :class:`ReportWindow`; ``close`` starts the next interval."""

    def __init__(self, identity: Identity, start_ms: int) -> None:
        self._lock = threading.Lock()
        self._window = ReportWindow(identity, start_ms)

    @property
    def identity(self) -> Identity:
        return self._window.identity

    def record(self, latency_ms: float, baseline: bool, rows: int,
               optional_units_done: int) -> None:
        with self._lock:
            self._window.record(latency_ms, baseline, rows, optional_units_done)

    def record_whole(self, latency_ms: float, base_rows: int, kept_rows: int) -> None:
        with self._lock:
            self._window.record_whole(latency_ms, base_rows, kept_rows)

    def record_rejected(self, baseline: bool) -> None:
        with self._lock:
            self._window.record_rejected(baseline)

    def close(self, now_ms: int, totals: LoadTotals) -> WindowReport:
        with self._lock:
            return self._window.close(now_ms, totals)
