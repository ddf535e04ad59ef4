"""When a baseline request is hedged on another replica, and when the slow one is skipped.

A baseline request must not fail, nor wait out a hung-connection bound, because one replica
froze (a long GC pause, a stuck VM, a process stopped with SIGSTOP). While another replica is
left to try, a baseline call that has not answered after a share of what is left of the
request's deadline (``attempt_share``, at least ``min_attempt_ms``) is *hedged*: the same
request goes to a replica not tried yet, with what is left of the deadline, and the first
answer serves it (the other call is cancelled). The first call is not given up: a replica that
is merely slow still answers, and the request is never later than it would have been without
the hedge. Each call keeps the hung-connection bound (``baseline_timeout_ms``), so baseline is
never dropped for being slow. A replica a hedge beat by more than it had been waited for (the
hedge answered sooner than the first call's head start) is skipped for ``down_s``: the next
requests avoid it, so a freeze costs the requests in flight on it, plus one a skip time.

Hedging must not send an overloaded pool, where every replica is slow, twice its work. Hedges
are paid from a budget (`workers.policy.hedge_budget`): each baseline request adds
``budget_ratio`` of a hedge, banked up to ``budget_burst``, and each hedge takes one; with the
budget spent a slow call is simply waited for, as before hedging. And where every replica is
slow, the first call answers before the hedge does, so no replica is skipped: a pool slow
everywhere is not emptied by its own hedges.

Pure: no clock and no I/O; the client (`workers.client.client`) times the calls.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from workers.policy.hedge_budget import HedgeBudget


class RetryConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """When a baseline request is hedged on another replica."""

    #: Share of what is left of a request's deadline a baseline call is waited for before the
    #: request is hedged on another replica (while one is left and the budget allows).
    attempt_share: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.5
    #: Shortest such wait, in ms: a request with little deadline left still gives a healthy
    #: replica this long before it is hedged.
    min_attempt_ms: Annotated[float, Meta(gt=0.0, le=60_000.0)] = 20.0
    #: Hedges allowed per baseline request (the budget's refill): an overloaded pool gets at
    #: most this share of work more. 0 with no burst: never hedge.
    budget_ratio: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.1
    #: Hedges banked at most, and at the start: a freeze's first burst (the requests in flight
    #: on the replica as it stopped) is hedged in full.
    budget_burst: Annotated[float, Meta(ge=0.0, le=10_000.0)] = 10.0
    #: Seconds a replica that a hedge beat is skipped (while another of its pool is left).
    down_s: Annotated[float, Meta(ge=0.0, le=600.0)] = 2.0


class BaselineRetry:
    """The hedge budget and the wait before each hedge. Use it from one thread."""

    def __init__(self, config: RetryConfig, hung_ms: float) -> None:
        """
        :param config: the share, floor, budget and skip time (`RetryConfig`).
        :param hung_ms: the longest any call waits (``baseline_timeout_ms``), the bound on a
            hung connection: a hedge due no sooner is not worth one.
        """
        self.config = config
        self.hung_ms = hung_ms
        self.budget = HedgeBudget(config.budget_ratio, config.budget_burst)

    def request(self) -> None:
        """A baseline request starts: it adds `budget_ratio` of a hedge to the budget."""
        self.budget.earn()

    def hedge_after_ms(self, left_ms: float, others_left: int) -> float | None:
        """How long a call is waited for before the request is hedged.

        :param left_ms: what is left of the request's deadline as the call starts.
        :param others_left: replicas of the pool not tried yet for this request.
        :return: ``attempt_share`` of `left_ms`, at least ``min_attempt_ms``; None (no
            hedge) when no other replica is left or the wait reaches the hung bound.
        """
        if others_left <= 0:
            return None
        wait = max(self.config.min_attempt_ms, self.config.attempt_share * left_ms)
        return wait if wait < self.hung_ms else None

    def take_hedge(self) -> bool:
        """A call was waited for `hedge_after_ms`: hedge now? Yes while the budget holds one,
        which it takes."""
        return self.budget.spend()

    def skip_s(self, head_start_ms: float, answered_ms: float) -> float:
        """Seconds to skip the replica a hedge beat (0: do not). `head_start_ms`: how long
        its call had run when the hedge was sent; `answered_ms`: how long the hedge took.
        Only when the hedge took less than that head start: the first replica is slower than
        another by more than the wait, not a pool slow everywhere."""
        return self.config.down_s if answered_ms < head_start_ms else 0.0
