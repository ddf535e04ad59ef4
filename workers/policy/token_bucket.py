"""The optional-work budget on one worker: a token bucket refilled at the rate the control
plane's targets give (``budget_units_per_s``). Pure: time comes in as integer milliseconds.
"""

from __future__ import annotations


class TokenBucket:
    """Budget of optional units per second; ``None`` rate means no budget limit.

    Holds at most ``burst_s`` seconds of the rate, or ``floor_units`` where that is more; a
    fresh budget starts full, and a lower rate cuts what is banked to its own depth.
    """

    def __init__(self, burst_s: float) -> None:
        self.burst_s = burst_s
        self.rate_per_s: float | None = None
        self.floor_units = 0.0
        self.tokens = 0.0
        self.last_ms = 0

    @property
    def depth(self) -> float:
        """The most units banked (0 without a rate)."""
        rate = self.rate_per_s or 0.0
        return max(rate * self.burst_s, self.floor_units if rate > 0 else 0.0)

    def set_rate(self, rate_per_s: float | None, now_ms: int, floor_units: float = 0.0) -> None:
        """``floor_units``: the least it may bank, whatever the rate (see ``ExtraAllowance``)."""
        self._refill(now_ms)
        if rate_per_s is None:
            self.rate_per_s = None
            return
        fresh = self.rate_per_s is None
        self.rate_per_s = max(0.0, rate_per_s)
        self.floor_units = max(0.0, floor_units)
        if fresh:
            self.tokens = self.depth  # a fresh budget starts full
        self.tokens = min(self.tokens, self.depth)

    def take(self, units: int, now_ms: int) -> bool:
        if self.rate_per_s is None:
            return True
        self._refill(now_ms)
        if self.tokens + 1e-9 < units:
            return False
        self.tokens -= units
        return True

    def _refill(self, now_ms: int) -> None:
        elapsed = max(0, now_ms - self.last_ms)
        self.last_ms = max(self.last_ms, now_ms)
        if self.rate_per_s is not None:
            self.tokens = min(self.depth, self.tokens + self.rate_per_s * elapsed / 1000.0)
