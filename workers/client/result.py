"""What a served request came to, for the caller: `RankResult`, or `RankingError` when the
baseline pool could not serve it; and the value a served request is worth, which the client
learns from only within +-`VALUE_BOUND` so one wild outcome cannot swamp the router's means."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from schemas.contract import AnswerUse
from workers.api import RankRequest, RankResponse
from workers.client.decision import Decision

OutcomeValue = Callable[[RankRequest, RankResponse], float]
VALUE_BOUND = 1e6


def bounded_value(value: float) -> float:
    """An outcome's value as the client logs and learns it: clamped to +-`VALUE_BOUND`."""
    return min(max(float(value), -VALUE_BOUND), VALUE_BOUND)


def top_score_value(request: RankRequest, response: RankResponse) -> float:
    """A stand-in value: the request's value signal times its best score. It compares raw
    scores of two different models, so it is no measure of what the powerful model adds; it
    is not the default. A service with a real outcome signal (clicks, dwell, revenue) sends
    it as a label (`label`), or passes its own `outcome_value` when known at response time."""
    best = max(response.scores, default=0.0)
    return request.value * best


class RankingError(RuntimeError):
    """The baseline pool could not serve a request (`reason` says why)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"baseline call failed: {reason}")
        self.reason = reason


class RankResult(msgspec.Struct, frozen=True):
    """One served request: the worker's response and what the client decided and observed."""

    response: RankResponse
    decision: Decision
    fell_back: str | None
    value: float | None
    latency_ms: float
    answer: AnswerUse | None = None
    """What became of the precompute answer the request held (`PrecomputeSide.answer`):
    ``used``, ``withheld`` by the answer holdout, or None: it held none."""
