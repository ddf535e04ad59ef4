"""The allocator's value curves as measured: what a unit of lent capacity is worth to each
lever, read from the joined decisions' estimates (`offpolicy.GainEstimator`) at the measured
cost. The planner asks for them every period (`planner.Planner.learn`); until both levers are
measured the configured curves, the prior, stay. Pure.
"""

from __future__ import annotations

import itertools
import math

from streams.control.moments import SCALES
from streams.control.offpolicy import GainEstimator

#: The most pieces RMA's learned curve has (`rma_curve`): an octave of extras each, enough
#: for a curve bending at one candidate to reach past 2,000.
MAX_RMA_PIECES = 14


def _grid(value: float, steps_per_octave: int = 8) -> float:
    """``value`` (> 0) on a geometric grid: curves that move by noise do not re-solve the LP."""
    return float(2.0 ** (round(math.log2(value) * steps_per_octave) / steps_per_octave))


def learned_curves(est: GainEstimator, *, rma_units_per_accel_s: float,
                   sbm_rps_per_accel: float, request_rps: float, max_extra: float
                   ) -> tuple[tuple[tuple[float, float], ...],
                              tuple[tuple[float, float], ...]] | None:
    """The allocator's value curves from measured value, in value per second per accelerator
    unit; None (keep the configured curves, the prior) until both levers are measured: RMA's
    value per extra candidate with an interval above zero, and a positive gain for at least
    one segment.

    SBM: one piece per segment of positive posterior gain, highest first, as wide as the
    units that would serve all of its traffic (its share of the labelled treated requests
    times ``request_rps``, over ``sbm_rps_per_accel``), worth its gain times
    ``sbm_rps_per_accel``. RMA: concave, from its lift at the extras the requests carried
    and the shape the joined outcomes fit best (`rma_curve`), out to ``max_extra`` a
    request. Values and widths sit on a geometric grid (1/8 octave)."""
    lift = est.lift()
    per_extra, rma_lift = lift["rma_per_extra"], lift["rma"].measured
    if (per_extra.measured is None or per_extra.ci_low is None or per_extra.ci_low <= 0
            or rma_lift is None or rma_units_per_accel_s <= 0 or sbm_rps_per_accel <= 0
            or request_rps <= 0):
        return None
    treated = est.counts()["treated"]
    if treated <= 0:
        return None
    pieces = []
    priorities = est.priorities()
    for name, arms in est.state.segments.items():
        if est.gain(name).measured is None:
            continue
        gain = priorities[name].gain_mean
        share = (arms.baseline.n + arms.powerful.n) / treated
        if gain <= 0 or share <= 0:
            continue
        pieces.append((_grid(share * request_rps / sbm_rps_per_accel),
                       _grid(gain * sbm_rps_per_accel), name))
    if not pieces:
        return None
    pieces.sort(key=lambda p: (-p[1], p[2]))
    sbm = tuple((w, v) for w, v, _ in pieces)
    scale = SCALES[est.scale()]
    rma = rma_curve(rma_lift, est.mean_covariate(), scale, max_extra,
                    units_per_accel_s=rma_units_per_accel_s, request_rps=request_rps)
    if not rma:
        return None
    return rma, sbm


def rma_curve(lift: float, mean_x: float, scale: float, max_extra: float, *,
              units_per_accel_s: float, request_rps: float) -> tuple[tuple[float, float], ...]:
    """RMA's value curve, concave: a request's value from ``e`` extra candidates taken as
    c log1p(e / ``scale``), the shape whose covariate the joined outcomes fit best
    (`moments.best_scale`), its level c the measured lift over the mean covariate the
    requests carried (``lift`` / ``mean_x``, both against the holdout, so the level is not
    the within-arm slope, which load and time of day confound). One piece per octave of
    extras from ``scale``/2 to ``max_extra``, each as wide as the units its extras take at
    ``request_rps`` (``units_per_accel_s`` a unit) and worth its mean marginal value per
    unit. A single linear piece at the mean value per extra had priced the first extras
    several times too low and the last ones too high (on a curve bending at 16, what
    one more extra adds at 0 is 5.6 times its mean over 256, at 256 a third of it).
    Empty when nothing is worth having (no lift, no covariate)."""
    if lift <= 0 or mean_x <= 0 or max_extra <= 0 or scale <= 0:
        return ()
    level = lift / mean_x
    edges = [0.0]
    edge = scale / 2.0
    while edge < max_extra and len(edges) < MAX_RMA_PIECES:
        edges.append(edge)
        edge *= 2.0
    edges.append(float(max_extra))
    pieces = []
    for lo, hi in itertools.pairwise(edges):
        marginal = level * (math.log1p(hi / scale) - math.log1p(lo / scale)) / (hi - lo)
        pieces.append((_grid((hi - lo) * request_rps / units_per_accel_s),
                       _grid(marginal * units_per_accel_s)))
    return tuple(pieces)
