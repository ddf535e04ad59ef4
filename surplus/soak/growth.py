"""Did anything grow after the warm-up? Pure: samples in, one verdict per process and measure.

A measure's *start* is the mean of its samples in the first quarter of the run after the
warm-up, its *end* the mean of those in the last quarter, and its growth the ratio of the two.
Means over long windows rather than two single samples: fds move with the connections of the
moment (a client opens one for each request that finds the others busy, a worker closes one
after 100 responses), RSS with the garbage not yet collected, and a leak is what raises the
level the whole window long, not one sample; a level that only wanders (fds of 25 to 28 under
a steady load) averages out where a median of whole numbers would jump between them. A leak
that is steady over the run shows at three quarters of its size.

Counts of what a process opens and closes (fds, threads) are read as each window's *lowest*
sample instead: a leaked socket or thread is never closed, so a leak raises the lowest count
of every later window, while the connections of the moment (a burst of concurrent requests on
a loaded machine) raise only some samples. A short run's means of 26 fds against 29 at its end
were such a moment, not a leak.

Lag and targets age hover near zero, where a ratio says nothing (0 → 2 messages is not
"infinite growth"), so each may have a *floor*: the start is judged as at least the floor.
100 messages of lag. Two control periods of targets age: a worker sees its targets anywhere
between just issued and one period old, and a tick that a loaded machine delays adds up to
another (with a 2 s period and a 6 s TTL, an end past 4.4 s fails: targets close to lapsing).
Growth past the floor still fails.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: What /proc says about every process.
RESOURCES = ("rss_mib", "fds", "threads")
#: Messages of lag under which a ratio means nothing (see the module docstring).
LAG_FLOOR = 100.0
#: Counts judged by each window's lowest sample, not its mean (see the module docstring).
BY_LOWEST = frozenset({"fds", "threads"})
#: Whole handles a count may rise by whatever the ratio says: a keep-alive pool settles a
#: few connections higher when requests take longer or come in a burst (29 -> 32 fds on a
#: worker in a 2.5 min soak; 33 -> 38 on the load generator in one step at a burst, level for
#: the 50 s after it), where 10% of 30 is three. A leak keeps rising past it: one fd a minute
#: is +8 between the windows of a 10 min soak and +30 in a 30 min `make soak`; the 2.5 min
#: soak of the integration test catches only a fast one.
COUNT_SLACK = 7.0

Series = Mapping[str, Mapping[str, Sequence[tuple[float, float]]]]
"""process -> measure -> [(seconds into the run, value)], in time order."""


@dataclass(frozen=True)
class Windows:
    """Where start and end are read, in seconds into the run."""

    warmup_s: float
    end_s: float
    window_s: float

    @property
    def start(self) -> tuple[float, float]:
        return self.warmup_s, self.warmup_s + self.window_s

    @property
    def end(self) -> tuple[float, float]:
        return max(self.warmup_s, self.end_s - self.window_s), self.end_s


def windows(duration_s: float, warmup_s: float, interval_s: float) -> Windows:
    """A quarter of the judged stretch, and at least three samples, for each window."""
    window = max(3 * interval_s, 0.25 * max(0.0, duration_s - warmup_s))
    return Windows(warmup_s=warmup_s, end_s=duration_s, window_s=window)


@dataclass(frozen=True)
class Verdict:
    """One process's one measure, judged."""

    process: str
    measure: str
    start: float | None
    end: float | None
    growth: float | None
    samples: int
    ok: bool
    why: str = ""
    floor: float = 0.0


def judge(series: Series, expected: Mapping[str, Sequence[str]], span: Windows,
          bound: float, floors: Mapping[str, float]) -> list[Verdict]:
    """A verdict for every expected (process, measure): grown by more than ``bound`` (0.10 is
    10%), or not measured at the start or the end, is a failure that says which."""
    out = []
    for process, measures in expected.items():
        for measure in measures:
            points = series.get(process, {}).get(measure, [])
            out.append(_one(process, measure, points, span, bound, floors.get(measure, 0.0)))
    return out


def _one(process: str, measure: str, points: Sequence[tuple[float, float]], span: Windows,
         bound: float, floor: float) -> Verdict:
    level = _lowest if measure in BY_LOWEST else _mean
    start, end = level(points, *span.start), level(points, *span.end)
    samples = sum(1 for t, _ in points if t >= span.warmup_s)
    growth, why = _growth(start, end, floor, bound)
    if why and measure in BY_LOWEST and start is not None and end is not None \
            and end - start <= COUNT_SLACK:
        why = ""
    return Verdict(process, measure, start, end, growth, samples, ok=not why, why=why,
                   floor=floor)


def _growth(start: float | None, end: float | None, floor: float,
            bound: float) -> tuple[float | None, str]:
    """End over start (at least the floor), and why that fails ("" when it does not)."""
    if start is None:
        return None, "no samples after the warm-up"
    if end is None:
        return None, "no samples at the end"
    reference = max(start, floor)
    if reference <= 0:
        return (1.0, "") if end <= 0 else (None, f"grew from 0 to {end:g}")
    growth = round(end / reference, 3)
    if growth <= 1.0 + bound:
        return growth, ""
    return growth, (f"grew {growth:.2f}x after the warm-up ({start:g} -> {end:g}"
                    + (f", judged from at least {floor:g}" if floor > start else "")
                    + f"), bound {1.0 + bound:.2f}x")


def _mean(points: Sequence[tuple[float, float]], lo: float, hi: float) -> float | None:
    values = [v for t, v in points if lo <= t <= hi]
    return round(statistics.fmean(values), 3) if values else None


def _lowest(points: Sequence[tuple[float, float]], lo: float, hi: float) -> float | None:
    values = [v for t, v in points if lo <= t <= hi]
    return min(values) if values else None


def failures(verdicts: Sequence[Verdict]) -> list[str]:
    """One line per failed verdict: the process, the measure, and what happened."""
    return [f"{v.process} {v.measure}: {v.why}" for v in verdicts if not v.ok]
