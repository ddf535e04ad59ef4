"""`bench.fleet`'s verdicts, pure: percentiles, whether a consumer's lag keeps up, the delay
from a window's close to its targets, and scope names that land on partitions of their own.
No broker, no clock: the benchmark feeds them what it sampled, and the tests feed them numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from schemas.topics import scope_partition


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q` quantile (0..1) by linear interpolation between order statistics; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * min(max(q, 0.0), 1.0)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (t, y); 0 for fewer than two distinct times."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return 0.0
    return sum((t - mt) * (y - my) for t, y in points) / var


def keeps_up(lag: Sequence[tuple[float, float]], in_rate: float,
             bound_s: float = 5.0, growth: float = 0.05) -> dict[str, Any]:
    """Whether a consumer keeps up, from (t_s, lag_messages) samples over a run.

    It keeps up when, over the second half of the samples, the lag's fitted slope is at most
    `growth` of the input rate (it takes at least 95% of what comes in: anything less grows
    without bound) and the last lag is under `bound_s` seconds of input (commits are a second
    apart, so a consumer that keeps up shows about a second of lag).
    """
    if len(lag) < 4:
        return {"keeps_up": False, "why": "too few lag samples"}
    half = lag[len(lag) // 2:]
    trend = slope(half)
    last = half[-1][1]
    bound = max(bound_s * in_rate, 100.0)
    ok = trend <= growth * max(in_rate, 1.0) and last <= bound
    return {"keeps_up": ok, "lag_slope_per_s": round(trend, 1), "lag_last": last,
            "lag_max": max(y for _, y in lag), "lag_bound": round(bound)}


def consumed_at(counts: Sequence[tuple[float, float]], needed: float) -> float | None:
    """The first time (from (t, cumulative count) samples, in order) the count reached
    `needed`; None if it never did."""
    for t, count in counts:
        if count >= needed:
            return t
    return None


def after_close_delays(closes_s: Sequence[float], per_window: int,
                       counts: Sequence[tuple[float, float]],
                       targets: Mapping[str, Sequence[float]], since_s: float,
                       until_s: float) -> tuple[list[float], int]:
    """Per scope and fleet window closed in [since_s, until_s): seconds from the close to the
    scope's first targets published once the control plane had counted all of the window's
    reports (``(w + 1) * per_window`` in all). Windows it never counted, or with no targets
    after, are returned as a count instead (they missed)."""
    delays: list[float] = []
    missed = 0
    for w, close in enumerate(closes_s):
        if not since_s <= close < until_s:
            continue
        seen = consumed_at(counts, (w + 1) * per_window)
        for times in targets.values():
            after = next((t for t in times if seen is not None and t >= seen), None)
            if after is None:
                missed += 1
            else:
                delays.append(max(after - close, 0.0))
    return delays, missed


def region_names(regions: int, partitions: int) -> list[str]:
    """`regions` scope names, each on a partition of its own while there are partitions to
    spare (a scope's events all go to one partition, by murmur2 of its name)."""
    names: list[str] = []
    used: set[int] = set()
    candidate = 0
    while len(names) < regions:
        name = f"r{candidate}"
        candidate += 1
        p = scope_partition(name, partitions)
        if p in used and len(used) < partitions and candidate < 100_000:
            continue
        used.add(p)
        names.append(name)
    return names
