"""When a request routed to the powerful model is hedged on the ranking pool.

A client waits for the powerful model up to its share of the deadline (``powerful_wait_ms``)
and then falls back. That wait is sized for the deadline, not for the model: in the chaos
runs the powerful model answered in about 12 ms and the wait was 150 ms, so a powerful
replica that froze (a stall, not a notice) held each request routed to it for the whole wait
plus a baseline call, past the SLA the ranking path keeps.

So a powerful call is hedged once it is late by what the pool has been measured to do, not by
a configured number: ``late_factor`` times the p95 of its recent answers (a DDSketch per window
of ``window_answers``; each window's p95 sets the wait for the next, and before the first there
is no hedge), never sooner than ``min_wait_ms`` and only when that is before the powerful wait
runs out. The p95, not the p99: a stall's hedged calls (a few in a window) must not lengthen the
wait for the next stall. In seed 3's 1,800 s chaos run, seven calls given up at about 30 ms in
one freeze made the next window's p99 33 ms against answers of 7 ms, so the next freeze was
hedged after 100 ms and its requests answered in 107-116 ms, past the 100 ms SLA.

The hedge is the request's fallback, sent early: its baseline work, with what is left of
the deadline, to the ranking pool. The first answer serves the request. The powerful
call is not given up when the hedge is sent: if it answers first, it serves; if the hedge does,
the powerful call is late and given up, and the client counts it as a failed call of that pool
(its allowance is cut) and skips that replica for a while.

Hedges are paid from a budget (`workers.policy.hedge_budget`), so a powerful pool slow
everywhere does not double the ranking pool's fallback work. A call given up late still teaches
the window: the time it was given up at is a lower bound of its latency, so a pool that got
slower everywhere raises its own p99 instead of being hedged forever.

Pure: no clock and no I/O; the client (`workers.client.pool_calls`) times the calls.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from schemas.sketch import new_sketch
from workers.policy.hedge_budget import HedgeBudget

#: The quantile of a window's answers that its hedge wait is a multiple of: under 1 - QUANTILE
#: of a window given up late (a stall) leaves the next wait where the answers put it.
QUANTILE = 0.95


class HedgeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """When a powerful call is hedged on the ranking pool."""

    #: A powerful call not answered after this multiple of the pool's recent p95 is hedged.
    late_factor: Annotated[float, Meta(ge=1.0, le=100.0)] = 3.0
    #: Shortest wait before a hedge, in ms.
    min_wait_ms: Annotated[float, Meta(gt=0.0, le=60_000.0)] = 20.0
    #: Answers per learning window: each window's p99 sets the hedge wait for the next.
    window_answers: Annotated[int, Meta(ge=10, le=1_000_000)] = 200
    #: Hedges allowed per powerful request (the budget's refill). 0 with no burst: never.
    budget_ratio: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.1
    #: Hedges banked at most, and at the start.
    budget_burst: Annotated[float, Meta(ge=0.0, le=10_000.0)] = 10.0


class PowerfulHedge:
    """The learned wait before a hedge, and the hedge budget. Use it from one thread."""

    def __init__(self, config: HedgeConfig) -> None:
        self.config = config
        self.budget = HedgeBudget(config.budget_ratio, config.budget_burst)
        #: The wait before a hedge the last window measured (None: no window closed yet).
        self.late_ms: float | None = None
        self._window = new_sketch()

    def request(self) -> None:
        """A powerful call starts: it earns its share of a hedge."""
        self.budget.earn()

    def answered(self, latency_ms: float) -> None:
        """A powerful call answered after `latency_ms` (or was given up then, late)."""
        self._window.add(max(latency_ms, 0.0))
        if self._window.count >= self.config.window_answers:
            recent = self._window.get_quantile_value(QUANTILE)
            self.late_ms = None if recent is None else self.config.late_factor * recent
            self._window = new_sketch()

    def hedge_after_ms(self, wait_ms: float) -> float | None:
        """How long a powerful call is waited for before it is hedged; None: not hedged (no
        window measured yet, or the hedge would come no sooner than the powerful wait,
        `wait_ms`, runs out)."""
        if self.late_ms is None:
            return None
        after = max(self.config.min_wait_ms, self.late_ms)
        return after if after < wait_ms else None

    def take(self) -> bool:
        """A call was waited for `hedge_after_ms`: hedge now? Yes while the budget allows."""
        return self.budget.spend()
