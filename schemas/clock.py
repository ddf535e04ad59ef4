"""The one wall clock of Surplus.

Targets (`issued_at_ms`), preemption notices (`ts_ms`, `deadline_ms`), window reports and
capacity events are all stamped in wall-clock milliseconds since the epoch, and compared across
processes and hosts. Every live process reads that time base here, so there is one definition
of it; pure code (controllers, policies, the simulator) never reads a clock and takes `now_ms`
as an argument instead.
"""

from __future__ import annotations

import time


def wall_ms() -> int:
    """Wall-clock milliseconds since the epoch: the time base of targets, notices and reports."""
    return time.time_ns() // 1_000_000
