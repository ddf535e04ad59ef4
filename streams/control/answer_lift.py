"""What the precompute lever measurably pays: visits that used an answer against visits whose
answer the answer holdout withheld (`workers.policy.holdout.withholds_answer`).

Visits that hold a fresh answer are not like the rest (their users come back often, so they
are worth more whatever they get), so comparing them with visits without one would credit the
lever with its users' worth. The answer holdout ranks a random share of them live as if they
had none, so within each segment the two groups differ only in the answer. Per hit, and per
treated request (the hits' share of the treated requests times that)::

    per_hit = post-stratified (used - withheld)             (`streams.control.strata`)
    precompute = (Σ v used / Σ v treated) per_hit,    Var = (Σ v used / Σ v treated)² Var(per_hit)

The share is counted, not estimated, at full logging; with sampled records its own variance
is left out (small beside the per-hit one's at the holdout's few percent). Both groups are
treated requests (RMA and SBM work on them as on any other), so the lift of the other levers,
measured against the request holdout, includes the precompute lever's until it is taken out:
``rma = all - sbm - precompute`` (`GainEstimator.lift`).
"""

from __future__ import annotations

import msgspec

from schemas.contract import AnswerUse
from streams.control.moments import Estimate, Moments, estimate
from streams.control.strata import Stratum, post_stratified


class AnswerState(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The answer lift's sums (part of the estimators' snapshot): per segment, ``treated``
    the visits that used an answer and ``holdout`` those whose answer was withheld."""

    strata: dict[str, Stratum] = {}
    rest: Stratum = Stratum()
    """Visits of segments past the bound, one stratum for all of them."""
    used: Moments = Moments()
    withheld: Moments = Moments()


class AnswerLift:
    """Used against withheld answers, segment by segment, from joined decision records."""

    def __init__(self, max_segments: int, state: AnswerState | None = None) -> None:
        state = state or AnswerState()
        self.max_segments = max_segments
        self._strata = dict(state.strata)
        self._rest = state.rest
        self._used = state.used
        self._withheld = state.withheld

    @property
    def seen(self) -> bool:
        """Whether any visit with an answer was joined (the lever is on in this scope)."""
        return self._used.n + self._withheld.n > 0

    def observe(self, segment: str, value: float, answer: AnswerUse, v: float) -> None:
        """One joined treated visit that held an answer, standing for ``v`` requests."""
        withheld = answer == "withheld"
        if withheld:
            self._withheld = self._withheld.add(value, v)
        else:
            self._used = self._used.add(value, v)
        stratum = self._strata.get(segment)
        if stratum is None and len(self._strata) >= self.max_segments:
            self._rest = self._rest.add(value, withheld, v)
            return
        self._strata[segment] = (stratum or Stratum()).add(value, withheld, v)

    def lift(self, treated: Moments, min_labels: int, z: float) -> tuple[Estimate, Estimate]:
        """``(per hit, per treated request)``; empty below ``min_labels`` visits a group."""
        used, withheld = self._used, self._withheld
        if used.n < min_labels or withheld.n < min_labels or treated.w <= 0:
            return Estimate(), Estimate()
        mean, var = post_stratified(self._strata, self._rest, used, withheld, min_labels)
        share = used.w / treated.w
        return estimate(mean, var, z), estimate(share * mean, share * share * var, z)

    @property
    def state(self) -> AnswerState:
        return AnswerState(strata={k: self._strata[k] for k in sorted(self._strata)},
                           rest=self._rest, used=self._used, withheld=self._withheld)
