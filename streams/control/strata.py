"""Two groups compared segment by segment: the post-stratified difference of their means.

The lift of optional work (treated requests against the holdout, `GainEstimator.lift`) and the
precompute lever's (visits that used an answer against those whose answer was withheld,
`streams.control.answer_lift`) are the same comparison: both groups are drawn at random within
every segment (by request-id hash), so comparing within segments takes the segments' different
worths out of the difference and out of its interval. Strata k are the segments with at least
``min_labels`` rounds in both groups (the short ones pooled into one, or into the largest when
that is short too), T the first group, C the second::

    mean = Σ_k W_k (ybar_Tk - ybar_Ck),    W_k = Σ_{i in k} v_i / Σ_i v_i    (over T)
    var  = Σ_k W_k² (Var(ybar_Tk) + Var(ybar_Ck))                            (Welch within each)

and with sampled records (some v > 1) the variance of the estimated shares is added::

    var += Σ_k (d_k - mean)² Σ_{i in k} v_i² / (Σ v)²,      d_k = ybar_Tk - ybar_Ck

The plain difference of means when no stratum is complete, or when the strata do not hold
every round the totals do (a snapshot from before they were kept).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from streams.control.moments import Moments, sampled
from streams.control.moments import merge as _merge


class Stratum(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
              array_like=True):
    """One segment's outcomes in the two groups (the names are the lift's: ``holdout`` is
    the control group)."""

    treated: Moments = Moments()
    holdout: Moments = Moments()

    def merge(self, other: Stratum) -> Stratum:
        return Stratum(treated=_merge(self.treated, other.treated),
                       holdout=_merge(self.holdout, other.holdout))

    def add(self, value: float, control: bool, v: float = 1.0) -> Stratum:
        """One more round, of weight ``v``, in the control group or the treated one."""
        if control:
            return Stratum(treated=self.treated, holdout=self.holdout.add(value, v))
        return Stratum(treated=self.treated.add(value, v), holdout=self.holdout)


def post_stratified(strata: Mapping[str, Stratum], rest: Stratum, treated: Moments,
                    control: Moments, min_labels: int) -> tuple[float, float]:
    """``(mean, variance)`` of treated minus control, post-stratified (module docstring).

    :param strata: per segment, the two groups' rounds.
    :param rest: the rounds of segments not kept apart (past the segment bound).
    :param treated: the treated group's totals (what the strata should add up to).
    :param control: the control group's totals.
    """
    plain = (treated.mean - control.mean, treated.var_of_mean + control.var_of_mean)
    k = max(min_labels, 2)
    parts = []
    for name in sorted(strata):
        s = strata[name]
        if s.treated.n >= k and s.holdout.n >= k:
            parts.append(s)
        else:
            rest = rest.merge(s)
    held = (rest.treated.n + sum(s.treated.n for s in parts),
            rest.holdout.n + sum(s.holdout.n for s in parts))
    if not parts or abs(held[0] - treated.n) > 0.5 or abs(held[1] - control.n) > 0.5:
        return plain
    if rest.treated.n >= k and rest.holdout.n >= k:
        parts.append(rest)
    elif rest.treated.n > 0 or rest.holdout.n > 0:
        largest = max(range(len(parts)), key=lambda i: (parts[i].treated.n, -i))
        parts[largest] = parts[largest].merge(rest)
    mean = var = 0.0
    for s in parts:
        share = s.treated.w / treated.w
        mean += share * (s.treated.mean - s.holdout.mean)
        var += share * share * (s.treated.var_of_mean + s.holdout.var_of_mean)
    if sampled(treated):   # the shares W_k are estimated from the sample
        var += sum((s.treated.mean - s.holdout.mean - mean) ** 2 * s.treated.w2
                   for s in parts) / (treated.w * treated.w)
    return mean, var
