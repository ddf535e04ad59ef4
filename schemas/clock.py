"""The one wall clock of Surplus.

Targets (`issued_at_ms`), preemption notices (`ts_ms`, `deadline_ms`), window reports and
capacity events are all stamped in wall-clock milliseconds since the epoch, and compared across
processes and hosts. Every live process reads that time base here, so there is one definition
of it; pure code (controllers, policies, the simulator) never reads a clock and takes `now_ms`
as an argument instead.
"""

from __future__ import annotations

import os
import time

#: Milliseconds added to this process's wall clock, to run it as if its host's clock were off
#: (drills and tests of clock skew between hosts; unset in production).
OFFSET_ENV = "SURPLUS_CLOCK_OFFSET_MS"


def _offset_from_env() -> int:
    raw = os.environ.get(OFFSET_ENV, "").strip()
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{OFFSET_ENV}: expected whole milliseconds, got {raw!r}") from None


_OFFSET_MS = _offset_from_env()


def wall_ms() -> int:
    """Wall-clock milliseconds since the epoch: the time base of targets, notices and reports."""
    return time.time_ns() // 1_000_000 + _OFFSET_MS


def wall_ms_fine() -> float:
    """`wall_ms` to the microsecond: when a notice arrived and was acted on, measured against
    its stamp in a millisecond or two."""
    return time.time_ns() / 1e6 + _OFFSET_MS


def wall_ms_at_edge() -> int:
    """`wall_ms`, read as a millisecond begins (waiting up to one for it).

    A stamp in whole milliseconds is up to one early for whoever measures from it with
    `wall_ms_fine`, half a millisecond on average: a notice stamped so would read that much
    slower to react than it was. Sent as the millisecond begins, its stamp is the moment it
    leaves to within the wake-up's tens of microseconds (and never later than it)."""
    edge_ns = (time.time_ns() // 1_000_000 + 1) * 1_000_000
    left_s = (edge_ns - time.time_ns()) / 1e9 - 0.0002
    if left_s > 0:
        time.sleep(left_s)
    while time.time_ns() < edge_ns:
        pass
    return edge_ns // 1_000_000 + _OFFSET_MS
