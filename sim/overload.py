"""Overload shedding outside the seconds a surprise excuses: how a run is judged on it.

Optional units shed for ``overload`` are the fast layers' answer to a surprise: a burst whose
arrivals the last targets did not plan for, or a reclaim. Outside the seconds after one, they
mean the targets send more than the replicas serve, which the control loop should not do in
the steady state. So a run reports the overload it shed per optional unit done twice: over
the whole run, and over the seconds no notice or burst onset excuses.

A second is a burst onset when its arrivals are at least ``BURST_RATIO`` times the median of
the ``SETTLED_S`` seconds before it. A notice or an onset excuses the ``EXCUSE_S`` seconds after
it. Pure numpy, so that the rule is one place and its tests need no simulator.

Why these numbers: the Azure conversation trace (CC BY 4.0) that most scenarios replay jumps
by half its settled rate every few seconds (669 such seconds in `azure_steady_tight`'s hour),
which is the trace's ordinary roughness, not a burst; at double it counts 177 there, 20 in
`burst_tight` (its 20 scripted bursts) and 11 in `demo_tight`. Five seconds is a few of the
workers' telemetry reports: the fast layers' time, before the loop has seen the change.
"""

from __future__ import annotations

import numpy as np

#: Seconds of arrivals whose median is the settled rate a burst onset is measured against.
SETTLED_S = 10
#: Arrivals in one second over the settled rate that make the second a burst onset.
BURST_RATIO = 2.0
#: Seconds after a burst onset or a notice whose overload shedding is the fast layers' answer.
EXCUSE_S = 5


def burst_onsets(arrivals_per_s: np.ndarray) -> np.ndarray:
    """Seconds whose arrivals are at least ``BURST_RATIO`` times the median of the
    ``SETTLED_S`` seconds before them (a second with no settled past is no onset)."""
    counts = np.asarray(arrivals_per_s, dtype=float)
    onset = np.zeros(len(counts), dtype=bool)
    for s in range(1, len(counts)):
        settled = float(np.median(counts[max(0, s - SETTLED_S):s]))
        onset[s] = settled > 0 and counts[s] >= BURST_RATIO * settled
    return onset


def excused(arrivals_per_s: np.ndarray, notice_seconds: list[int],
            excuse_s: int = EXCUSE_S) -> np.ndarray:
    """Seconds within ``excuse_s`` after a burst onset or a notice (the second itself too)."""
    onsets = burst_onsets(arrivals_per_s)
    marks = np.zeros(len(onsets), dtype=int)
    marks[np.flatnonzero(onsets)] = 1
    for second in notice_seconds:
        if 0 <= second < len(marks):
            marks[second] = 1
    window = np.ones(max(1, excuse_s + 1), dtype=int)
    return np.convolve(marks, window)[:len(marks)] > 0


def overload_shares(shed_per_s: np.ndarray, done_per_s: np.ndarray,
                    excused_s: np.ndarray) -> dict[str, float | None]:
    """Overload units shed per optional unit done, over the run and over the seconds not
    excused, and the share of seconds excused. None where nothing was done."""
    shed = np.asarray(shed_per_s, dtype=float)
    done = np.asarray(done_per_s, dtype=float)
    steady = ~np.asarray(excused_s, dtype=bool)

    def share(mask: np.ndarray) -> float | None:
        total = float(done[mask].sum())
        return round(float(shed[mask].sum()) / total, 6) if total > 0 else None

    return {"overload_shed_share": share(np.ones(len(shed), dtype=bool)),
            "overload_shed_share_steady": share(steady),
            "excused_seconds_share": round(float((~steady).mean()), 6) if len(steady) else None}
