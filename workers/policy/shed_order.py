"""The order optional work is shed in, and the reasons it is shed for (``Admission``'s).

Optional work is kept highest first and shed lowest first by what the client expects it to
add; within a request, extras are shed from the requests with the most first, since under any
concave value curve of extra candidates the last of many is worth the least.
"""

from __future__ import annotations

from schemas.contract import ShedReason

REASON_OVERLOAD: ShedReason = "overload"
REASON_DEADLINE: ShedReason = "deadline"
REASON_PREEMPTION: ShedReason = "preemption"
REASON_BUDGET: ShedReason = "budget"


def shed_priority(value: float, gain: float | None) -> float:
    """The order optional work is kept in (highest first) and shed in (lowest first): what
    the client expects it to add (``gain``), not what the request is worth. A request without
    a gain (a client before it) is ordered by its value, as before."""
    return value if gain is None else gain


def marginal_extra_value(extra: int) -> float:
    """The expected gain of a request's last extra candidate, up to a scale: under any concave
    value curve of extra candidates the request with fewer extras has the higher marginal
    value, so extras are shed from the requests with the most first. The scale is the same
    for every request of a scope, so the order is all a replica needs."""
    return 1.0 / (1.0 + max(extra, 0))


def extras_gain(extra: int) -> float | None:
    """The gain a ranking request carrying ``extra`` extra candidates tells the replica
    (``RankRequest.gain``): its last extra's marginal value; None when it carries none."""
    return marginal_extra_value(extra) if extra > 0 else None
