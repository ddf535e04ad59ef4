"""The delay bound of a replica that serves whole requests as optional work (the
powerful-model pool), from the deadlines its requests carry.

Such a replica runs no baseline work that a queue could delay, and one of its requests may
take longer to serve than a ranking queue may wait, so its queue is bounded by how far ahead
its requests' deadlines lie, less the batcher's own wait, never less than
``max_queue_delay_ms``. Only a request's base rides that bound: its extra candidates fit under
``max_queue_delay_ms`` as extras do everywhere (``fit.extras_that_fit``). Pure: the caller
passes the times.
"""

from __future__ import annotations

#: Weight of the newest request in the deadline horizon of a whole-request replica.
HORIZON_ALPHA = 0.05


class DeadlineHorizon:
    """How far ahead of their arrival the deadlines of recent whole requests lay (an EWMA,
    the first request's own horizon until there is one)."""

    def __init__(self) -> None:
        self.ms = 0.0

    def admit(self, deadline_ms: int, now_ms: int) -> None:
        """A whole request due at ``deadline_ms`` was queued at ``now_ms``."""
        horizon = float(deadline_ms - now_ms)
        self.ms = horizon if not self.ms else self.ms + HORIZON_ALPHA * (horizon - self.ms)

    def bound(self, max_queue_delay_ms: float, batch_wait_ms: float) -> float:
        """The predicted wait above which optional work is shed: the horizon less the time
        the batcher may hold a request to fill a batch (which the prediction does not count),
        never under ``max_queue_delay_ms``."""
        return max(max_queue_delay_ms, self.ms - batch_wait_ms)
