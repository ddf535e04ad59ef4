"""Offered load on one worker over a recent and a settled window: what admission compares to
tell a baseline surge from the load the control loop has been running.

One concept a module, as concurrency-limits keeps its windows apart (`limit/window/`). Pure:
time comes in as integer milliseconds.
"""

from __future__ import annotations

import math


class LoadMeter:
    """Offered load (units per ms) of baseline and of optional work over a recent and a
    settled exponential window.

    Each sum is divided by the weight of the time observed so far rather than by the window's
    full weight, so a fresh meter reads the mean rate since it started instead of ramping up
    from zero (a new worker is not mistaken for a surge).
    """

    __slots__ = ("base", "last_ms", "norm", "opt", "recent_items", "taus")

    def __init__(self, recent_ms: float, settled_ms: float) -> None:
        self.taus = (recent_ms, settled_ms)
        self.base = [0.0, 0.0]
        self.opt = [0.0, 0.0]
        self.norm = [0.0, 0.0]
        self.last_ms: int | None = None
        #: Baseline items arrived in the recent window (exponentially weighted count).
        self.recent_items = 0.0

    def advance(self, now_ms: int) -> None:
        last = self.last_ms
        if last is None or now_ms < last:
            self.last_ms = now_ms if last is None else last
            return
        dt = now_ms - last
        if dt == 0:
            return
        for i, tau in enumerate(self.taus):
            decay = math.exp(-dt / tau)
            self.base[i] *= decay
            self.opt[i] *= decay
            self.norm[i] = self.norm[i] * decay + tau * (1.0 - decay)
            if i == 0:
                self.recent_items *= decay
        self.last_ms = now_ms

    def add(self, units: float, optional: bool) -> None:
        """Units offered now (negative: optional work withdrawn before it was served)."""
        sums = self.opt if optional else self.base
        sums[0] = max(0.0, sums[0] + units)
        sums[1] = max(0.0, sums[1] + units)
        if not optional:
            self.recent_items += 1.0

    def rate(self, window: int, optional: bool | None = None) -> float:
        """Units per ms over window 0 (recent) or 1 (settled): baseline, optional or (None)
        both."""
        norm = max(self.norm[window], 1.0)
        if optional is None:
            return (self.base[window] + self.opt[window]) / norm
        return (self.opt if optional else self.base)[window] / norm
