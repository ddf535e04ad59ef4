"""What pays for hedges: a budget earned per request, so a pool that is slow everywhere is not
sent twice its work by its own hedges.

As gRPC's and Finagle's retry budgets: each request earns ``ratio`` of a hedge, banked up to
``burst`` (and full at the start, so a freeze's first burst, the requests in flight as it
stopped, is hedged in full); each hedge spends one. Hedges therefore number at most
``burst + ratio * requests``; with the budget spent a slow call is simply waited for.

Pure: no clock and no I/O.
"""

from __future__ import annotations


class HedgeBudget:
    """Hedges banked. Use it from one thread."""

    def __init__(self, ratio: float, burst: float) -> None:
        """
        :param ratio: hedges earned per request (0 with no burst: never hedge).
        :param burst: hedges banked at most, and at the start.
        """
        self.ratio = ratio
        self.burst = burst
        #: Hedges banked.
        self.tokens = burst

    def earn(self) -> None:
        """A request starts: it adds `ratio` of a hedge."""
        self.tokens = min(self.burst, self.tokens + self.ratio)

    def spend(self) -> bool:
        """Hedge now? Yes while the budget holds one, which it takes."""
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True
