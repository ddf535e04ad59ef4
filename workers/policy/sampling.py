"""Which decision records a client logs: a deterministic sample by request id.

At ad scale a decision record per request is more than the join needs to measure lift, so a
client may log a share ``rate`` of them (``ClientConfig.decision_sample``). The rule::

    u(id)      = BLAKE2b(id, person="surplus/sample"), first 8 bytes / 2**64   in [0, 1)
    logged     = holdout or u(id) < rate
    inclusion  = 1 for a holdout request, else rate

The hash is personalised, so ``u`` is independent of the holdout's hash
(`workers.policy.holdout`), of the segment and of the router's draws: the logged sample is a
Bernoulli(rate) sample of the treated requests within every segment and arm, so the
router's logged propensities still hold within it (the sample preserves them) and a logged
record weighted by 1/inclusion stands for the requests it represents (Horvitz-Thompson).
The holdout is always logged: it is small already, and the lift's variance is mostly its.
Every client, the simulator, a replay and any labeller agree on which ids are logged, so a
labeller may drop the labels of requests never logged (they would be orphans).
"""

from __future__ import annotations

from hashlib import blake2b

_SCALE = float(1 << 64)
_PERSON = b"surplus/sample"


def sample_point(request_id: str) -> float:
    """Where ``request_id`` falls in [0, 1) for sampling (independent of the holdout's)."""
    digest = blake2b(request_id.encode(), digest_size=8, person=_PERSON).digest()
    return int.from_bytes(digest, "big") / _SCALE


def decision_inclusion(request_id: str, rate: float, holdout: bool) -> float | None:
    """The probability the decision record of ``request_id`` is logged with, or None when
    it is not logged.

    :param request_id: the request's id.
    :param rate: the client's sample rate, in (0, 1]; 1 logs every decision.
    :param holdout: whether the request is in the randomized holdout (always logged).
    """
    if holdout or rate >= 1.0:
        return 1.0
    return rate if sample_point(request_id) < rate else None
