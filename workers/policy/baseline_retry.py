"""When a baseline call stops waiting for a replica that does not answer, and tries another.

A baseline request must not fail because one replica froze (a long GC pause, a stuck VM, a
process stopped with SIGSTOP): the request is scored on another replica of the pool, within
its deadline. While another replica is left to try, an attempt waits a share of what is left
of the deadline (``attempt_share``, at least ``min_attempt_ms``) instead of the hung-connection
bound (``baseline_timeout_ms``), so the retry still fits; the last replica tried waits the full
bound, since baseline is never dropped for being slow. A replica that timed out while another
answered the same request sooner is skipped for ``down_s``: the next requests avoid it.

Retrying on timeouts must not send an overloaded pool, where every replica is slow, twice its
work. Short attempts are paid from a retry budget (as gRPC's and Finagle's): each baseline
request adds ``budget_ratio`` of a retry, banked up to ``budget_burst``, each retry on a timeout
takes one. With the budget spent, attempts wait the full bound again, as before this policy;
a retry already under way when it ran out is still made, and the debt is repaid first. So
timeout retries number at most ``budget_burst + budget_ratio * requests`` plus those in flight
together. And a replica is only skipped when another answered the same request sooner than the
first was waited for, so a pool that is slow everywhere is not emptied by its own timeouts.

Pure: no clock and no I/O; the client (`workers.client.client`) times the calls.
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta


class RetryConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How a baseline request gets past a replica that does not answer."""

    #: Share of what is left of a request's deadline one attempt waits while another replica
    #: is left to try (and the budget allows a retry); the rest is kept for the retry.
    attempt_share: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.5
    #: Shortest such wait, in ms: a request with little deadline left still gives a healthy
    #: replica this long before it is retried elsewhere.
    min_attempt_ms: Annotated[float, Meta(gt=0.0, le=60_000.0)] = 20.0
    #: Timeout retries allowed per baseline request (the retry budget's refill): an overloaded
    #: pool gets at most this share of work more. 0: never cut an attempt short.
    budget_ratio: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.1
    #: Timeout retries banked at most, and at the start: a freeze's first burst (the requests
    #: in flight on the replica as it stopped) is retried in full.
    budget_burst: Annotated[float, Meta(ge=0.0, le=10_000.0)] = 10.0
    #: Seconds a replica that timed out while another answered the same request sooner is
    #: skipped (while another replica of its pool is left).
    down_s: Annotated[float, Meta(ge=0.0, le=600.0)] = 2.0


class BaselineRetry:
    """The retry budget and the wait of each baseline attempt. Use it from one thread."""

    def __init__(self, config: RetryConfig, hung_ms: float) -> None:
        """
        :param config: the shares, floor, budget and skip time (`RetryConfig`).
        :param hung_ms: the longest any attempt waits (``baseline_timeout_ms``): the bound on
            a hung connection, and the wait of the last replica tried.
        """
        self.config = config
        self.hung_ms = hung_ms
        #: Retries banked; below 0 while a debt (retries made after it ran out) is repaid.
        self.tokens = config.budget_burst

    def request(self) -> None:
        """A baseline request starts: it adds `budget_ratio` of a retry to the budget."""
        self.tokens = min(self.config.budget_burst, self.tokens + self.config.budget_ratio)

    def attempt_ms(self, left_ms: float, others_left: int) -> float:
        """How long one attempt waits for its replica.

        :param left_ms: what is left of the request's deadline as the attempt starts.
        :param others_left: replicas of the pool not tried yet for this request.
        :return: with another replica to try and a retry in the budget,
            ``attempt_share`` of `left_ms`, at least ``min_attempt_ms`` and at most the hung
            bound; else the hung bound.
        """
        if others_left <= 0 or self.tokens < 1.0:
            return self.hung_ms
        wait = max(self.config.min_attempt_ms, self.config.attempt_share * left_ms)
        return min(wait, self.hung_ms)

    def retry_after_timeout(self, waited_ms: float, others_left: int) -> bool:
        """An attempt timed out: is the request tried on another replica? Yes when it was
        cut short for one (`attempt_ms` under the hung bound) and one is left; the retry is
        taken from the budget, into debt if another took the last one meanwhile. A hung
        attempt (the full bound) fails the request, as any other failure does."""
        if others_left <= 0 or waited_ms >= self.hung_ms:
            return False
        self.tokens -= 1.0
        return True

    def skip_s(self, waited_ms: float, answered_ms: float) -> float:
        """Seconds to skip a replica an attempt timed out on after `waited_ms` (0: do not),
        when another replica answered the same request in `answered_ms`: only if it answered
        sooner than the first was waited for, so a pool slow everywhere keeps its replicas."""
        return self.config.down_s if answered_ms < waited_ms else 0.0
