"""What optional work is worth, measured from joined decisions: off-policy gains and lift.

Every joined decision (``streams.control.labels``) is a logged bandit round i: its segment
s_i (the context), its arm a_i in {baseline, powerful} (``model``), the probability p_i the
router gave that arm (``propensity``), its covariate x_i = log1p(extras scored / s) and
its observed value y_i, and the probability pi_i that its record was logged at all
(``inclusion``: the client's ``decision_sample``, 1 for every holdout record and for a
client that logs every decision). Its sampling weight is v_i = 1/pi_i and its weight in the
arms w_i = v_i/p_i. Holdout rounds (no optional work at all, whichever model served them)
enter only the lift. The formulas, each kept as running sums
(`Moments`: mergeable, exact to replay, small enough for the controller's snapshot):

SNIPS, per segment s and arm a, over the rounds i of s that took a (self-normalised inverse
propensity scoring: obp's ``SelfNormalizedInverseProbabilityWeighting``, Swaminathan and
Joachims 2015; the stabilised IPW of the causal-inference texts)::

    mu_a   = sum_i w_i y_i / sum_i w_i
    Var    = sum_i w_i^2 (y_i - mu_a)^2 / (sum_i w_i)^2 * n/(n-1)       (delta method)
    gain_s = mu_powerful - mu_baseline

Regression adjustment for the arms' unequal extras (ANCOVA, Lin 2013; `adjusted_gain`), with
xbar_a = sum w x / sum w per arm and sums pooled within the arms, at the scale s among
``moments.SCALES`` whose covariate leaves the least residual sum of squares over every
segment (`moments.best_scale`: the value curve's bend learned, not assumed)::

    Sxx = sum_a sum_i w_i (x_i - xbar_a)^2      Sxy = sum_a sum_i w_i (x_i - xbar_a) y_i
    beta = max(0, Sxy / Sxx)
    gain_s = (mu_powerful - mu_baseline) - beta (xbar_powerful - xbar_baseline)
    Var   += (xbar_powerful - xbar_baseline)^2 (Syy - beta Sxy) / (n_eff Sxx)

with n_eff = sum_a (sum w)^2 / sum w^2 (Kish). Each arm's variance in the gain is shrunk
toward the prior noise sigma^2 = ``sbm.prior_obs_std``^2 worth m = ``sbm.prior_obs_weight``
rounds (`Moments.shrunk_var_of_mean`)::

    s^2 = sum w^2 (y - mu)^2 / sum w^2       Var(mu) = (n_eff s^2 + m sigma^2) / (n_eff + m) / n_eff

Segment priority (`GainEstimator.priority`), a normal posterior: prior mean g0 (the fleet-wide
adjusted gain), prior variance v0 = 2 ``sbm.prior_std``^2, data g with variance v::

    mean = (g0/v0 + g/v) / (1/v0 + 1/v)      var = 1 / (1/v0 + 1/v)

Post-stratified lift against the holdout (`GainEstimator.lift`), unit weights, strata k the
segments with at least ``min_labels`` labels on both sides (the short ones pooled into one,
or into the largest when that is short too), T treated and H holdout::

    lift = sum_k (n_Tk / n_T) (ybar_Tk - ybar_Hk)
    Var  = sum_k (n_Tk / n_T)^2 (s_Tk^2 / n_Tk + s_Hk^2 / n_Hk)         (Welch within each)
    sbm  = sum_s (n_powerful,s / n_T) gain_s,   Var = sum_s (n_powerful,s / n_T)^2 Var(gain_s)
    rma  = lift - sbm - precompute,   Var = Var(lift) + Var(sbm) + Var(precompute)
                                         (conservative);   rma_per_extra = rma / xbar

with n_powerful,s the treated rounds the powerful model served in s, xbar the mean extra
candidates sent with a treated request, and precompute the precompute lever's lift, measured
against its own holdout of answers (`streams.control.answer_lift`; 0 where no visit held an
answer). With no stratum complete the lift is the plain
difference of means, ybar_T - ybar_H, its variance s_T^2/n_T + s_H^2/n_H.

Sampled decision records (Horvitz-Thompson; the Hajek ratio form). A client that logs a
share pi of its treated decisions, picked by request-id hash independently of segment, arm
and holdout (`workers.policy.sampling`), logs a Bernoulli(pi) sample of them; each logged
round stands for v = 1/pi requests. Every mean above is already a ratio of weighted sums, so
the treated side takes v_i as its weight (the holdout's is 1)::

    ybar_T  = sum_i v_i y_i / sum_i v_i
    Var     = sum_i v_i^2 (y_i - ybar_T)^2 / (sum_i v_i)^2 * n/(n-1)
    n_Tk / n_T  ->  W_k = sum_{i in k} v_i / sum_i v_i       (the strata's and the SBM shares)
    xbar        ->  sum_i v_i extra_i / sum_i v_i

and the arms' weights become w_i = v_i/p_i (SNIPS, its variance and the adjustment are
ratios in w, so a single sample rate cancels out of them: the sample only makes them
noisier, which their n/(n-1) and n_eff already count). What sampling adds is that the
shares are now estimated from the sample rather than counted over every treated request.
Their delta-method variance is added when any treated round carries v > 1 (at full logging
the shares are a census of the joined requests, so the intervals are as before)::

    Var(all) += sum_k (d_k - lift)^2 sum_{i in k} v_i^2 / (sum_i v_i)^2      d_k = ybar_Tk - ybar_Hk
    Var(sbm) += r (sum_s P_s (gain_s - sbm)^2 + (sum_i v_i - sum_s P_s) sbm^2) / (sum_i v_i)^2

with P_s = sum v over the treated rounds the powerful model served in s and r = sum v^2 /
sum v over the treated rounds (exact when a scope's clients share one rate; v^2 per
segment is not kept). With the holdout always logged the lift's interval at pi = 0.01 is
about sqrt 2 as wide as at full logging: n_T falls to about n_H.

Drift scaling: an arm's sums keep at most n_max = ``sbm.max_effective_n`` rounds. Before
round n + 1 > n_max is added, every sum S (n, sum w, sum w y, ...) is scaled::

    S <- S (n_max - 1) / n        then the new round's terms are added, so n = n_max

which at n = n_max weighs a round k rounds old by (1 - 1/n_max)^k: an exponential window of
mean length n_max, so the gains follow drift. The lift's sums (treated, holdout, their
strata, the powerful share) are kept whole, since the controller's state began, so that both
sides of the comparison cover the same requests.

Why these. obp and Vowpal Wabbit's ``--cb`` evaluators estimate from the whole logged sample
(obp bootstraps its intervals over it); the control plane sees an unbounded stream, so here
the sufficient statistics are kept and the interval is the normal approximation. The prior
(``sbm.prior_*``, centred on the fleet-wide gain) ranks segments alone while there are no
labels and fades as labels arrive; that posterior is what the targets carry as segment
priorities. Segments differ in what a request is worth whatever optional work it gets, and a
1% holdout's segment mix wanders by chance; comparing within segments takes that noise out of
the lift and out of its interval (about a quarter narrower on the shipped scenarios) and keeps
it unbiased, the holdout being random within every segment (by request-id hash,
``workers.policy.holdout``). No clock, no randomness, no I/O: the same joined decisions give
the same estimates. ``tests/unit/control/test_offpolicy.py`` checks each formula against a
direct numpy implementation, and SNIPS against obp's on one logged sample.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import msgspec
from msgspec import UNSET

from schemas.contract import (
    DECISION_VERSION,
    LiftEstimate,
    LiftReport,
    RoutingOutcome,
    SegmentPriority,
)
from streams.control.answer_lift import AnswerLift, AnswerState
from streams.control.config import LabelsConfig, SbmConfig
from streams.control.moments import (
    Estimate,
    Moments,
    adjusted_gain,
    best_scale,
    estimate,
    sampled,
    sbm_share_var,
)
from streams.control.moments import merge as _merge
from streams.control.strata import Stratum, post_stratified

_BOUND = 1e6


class Arms(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True,
           array_like=True):
    baseline: Moments = Moments()
    powerful: Moments = Moments()
    powerful_total: float = 0.0
    """Treated rounds the powerful model served, never forgotten (the lift's SBM share)."""


class EstimatesState(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The estimators' sums (part of the controller's snapshot)."""

    segments: dict[str, Arms] = {}
    treated: Moments = Moments()
    holdout: Moments = Moments()
    treated_extra: float = 0.0
    """Extra candidates sent with the treated requests counted in ``treated``."""
    strata: dict[str, Stratum] = {}
    """The lift's sums per segment, never forgotten (``sbm.max_segments`` of them)."""
    unstratified: Stratum = Stratum()
    """Outcomes of segments past ``sbm.max_segments``, one stratum for all of them."""
    answers: AnswerState = AnswerState()
    """The precompute lever's used and withheld answers (`streams.control.answer_lift`)."""


class GainEstimator:
    """Per-segment SNIPS gains and holdout lift of one scope, from joined decisions."""

    def __init__(self, sbm: SbmConfig, labels: LabelsConfig,
                 state: EstimatesState | None = None) -> None:
        self.sbm = sbm
        self.labels = labels
        state = state or EstimatesState()
        self._segments: dict[str, Arms] = dict(state.segments)
        self._treated = state.treated
        self._holdout = state.holdout
        self._treated_extra = state.treated_extra
        self._strata: dict[str, Stratum] = dict(state.strata)
        self._unstratified = state.unstratified
        self._answers = AnswerLift(sbm.max_segments, state.answers)
        self._z = NormalDist().inv_cdf(0.5 + labels.confidence / 2.0)
        self._scale: int | None = None
        """The covariate's scale (`best_scale`) over the segments' sums, until they change."""

    def scale(self) -> int:
        """The index in ``moments.SCALES`` of the covariate the adjustment uses: the one the
        joined outcomes of every segment fit best, chosen again whenever they change."""
        if self._scale is None:
            self._scale = best_scale([(a.baseline, a.powerful)
                                      for _, a in sorted(self._segments.items())])
        return self._scale

    def mean_covariate(self) -> float:
        """The mean covariate log1p(extras / s) of the treated requests, at the scale the
        outcomes fit best (`scale`), weighted as the arms weigh them (SNIPS over both arms
        of every segment): where on RMA's value curve the measured lift was earned."""
        k = self.scale()
        wx = w = 0.0
        for arms in self._segments.values():
            for arm in (arms.baseline.at(k), arms.powerful.at(k)):
                wx += arm.wx
                w += arm.w
        return wx / w if w > 0 else 0.0

    def observe(self, joined: RoutingOutcome) -> None:
        """Fold one joined decision (its ``value`` set) in."""
        value = joined.value
        if value is None or not math.isfinite(value):
            return
        max_n = float(self.sbm.max_effective_n)
        # v: how many requests this logged record stands for (1/inclusion; 1 for holdout
        # records, always logged, and for a client that logs every decision).
        v = 1.0 if joined.holdout else joined.sample_weight
        # The lift's sums are never forgotten: treated and holdout must cover the same
        # requests (a moving treated mean against a whole-history holdout mean is biased
        # whenever the lift moves), as the SBM share below must.
        self._stratify(joined.segment, value, joined.holdout, v)
        if joined.holdout:
            self._holdout = self._holdout.add(value, 1.0)
            return
        self._treated = self._treated.add(value, v)
        self._treated_extra += v * joined.extra
        if joined.answer is not UNSET:
            self._answers.observe(joined.segment, value, joined.answer, v)
        seg = self._segments.get(joined.segment)
        if seg is None:
            if len(self._segments) >= self.sbm.max_segments:
                victim = min(self._segments, key=lambda s: (self._segments[s].baseline.n
                                                            + self._segments[s].powerful.n, s))
                del self._segments[victim]
            seg = Arms()
        weight, extra = v / joined.propensity, float(joined.extra)
        if joined.model == "powerful":
            seg = Arms(baseline=seg.baseline,
                       powerful=seg.powerful.add(value, weight, max_n, extra),
                       powerful_total=seg.powerful_total + v)
        else:
            seg = Arms(baseline=seg.baseline.add(value, weight, max_n, extra),
                       powerful=seg.powerful, powerful_total=seg.powerful_total)
        self._segments[joined.segment] = seg
        self._scale = None

    def _stratify(self, segment: str, value: float, holdout: bool, v: float) -> None:
        stratum = self._strata.get(segment)
        if stratum is None and len(self._strata) >= self.sbm.max_segments:
            self._unstratified = self._unstratified.add(value, holdout, v)
            return
        self._strata[segment] = (stratum or Stratum()).add(value, holdout, v)

    # -- per-segment gains -----------------------------------------------------------------

    def gain(self, segment: str) -> Estimate:
        """The data's SNIPS gain of one segment at equal extras::

            gain = (mu_powerful - mu_baseline) - beta (xbar_powerful - xbar_baseline)
            Var  = Var_shrunk(mu_powerful) + Var_shrunk(mu_baseline) + Var(adjustment)

        (`adjusted_gain`, `Moments.shrunk_var_of_mean`; no prior on the gain itself); empty
        until both arms have a label."""
        arms = self._segments.get(segment)
        if arms is None or arms.baseline.n < 1 or arms.powerful.n < 1:
            return Estimate()
        cfg = self.sbm
        prior_var, weight = cfg.prior_obs_std ** 2, cfg.prior_obs_weight
        k = self.scale()
        gain, slope_var = adjusted_gain(arms.baseline.at(k), arms.powerful.at(k))
        return estimate(gain, arms.powerful.shrunk_var_of_mean(prior_var, weight)
                         + arms.baseline.shrunk_var_of_mean(prior_var, weight) + slope_var,
                         self._z)

    def _fleet_gain(self) -> float:
        base = Moments()
        powerful = Moments()
        for name in sorted(self._segments):
            a = self._segments[name]
            base = _merge(base, a.baseline)
            powerful = _merge(powerful, a.powerful)
        k = self.labels.min_labels
        if base.n < k or powerful.n < k:
            return 0.0
        k = self.scale()
        return adjusted_gain(base.at(k), powerful.at(k))[0]

    def priority(self, segment: str, fleet_gain: float | None = None) -> SegmentPriority:
        """Posterior of a segment's gain, precision-weighted::

            v0 = 2 sbm.prior_std²        (prior variance: prior_std per arm)
            mean = (g0/v0 + g/v) / (1/v0 + 1/v),   var = 1 / (1/v0 + 1/v)

        with g, v the SNIPS `gain` and its variance (the prior alone while it is empty).

        :param segment: the segment.
        :param fleet_gain: g0, the prior's centre (default: the adjusted gain of all
            segments' arms merged, 0 below ``min_labels`` a side).
        """
        prior_mean = self._fleet_gain() if fleet_gain is None else fleet_gain
        prior_var = 2.0 * self.sbm.prior_std ** 2
        arms = self._segments.get(segment, Arms())
        est = self.gain(segment)
        if est.measured is None or est.std is None:
            mean, var = prior_mean, prior_var
        else:
            data_var = max(est.std ** 2, 1e-12)
            prec = 1.0 / prior_var + 1.0 / data_var
            mean = (prior_mean / prior_var + est.measured / data_var) / prec
            var = 1.0 / prec
        return SegmentPriority(gain_mean=max(-_BOUND, min(_BOUND, mean)),
                               gain_std=min(_BOUND, math.sqrt(var)),
                               observations=round(arms.baseline.n + arms.powerful.n))

    def priorities(self) -> dict[str, SegmentPriority]:
        """Every tracked segment's posterior gain, in name order (stable encoding)."""
        fleet = self._fleet_gain()
        return {name: self.priority(name, fleet) for name in sorted(self._segments)}

    def gains(self) -> dict[str, Estimate]:
        """Every tracked segment's measured gain (for the lead's gain-ordered shedding and
        for reports), in name order."""
        return {name: self.gain(name) for name in sorted(self._segments)}

    # -- lift against the holdout ----------------------------------------------------------

    def lift(self) -> dict[str, Estimate]:
        """Measured lift per treated request (formulas in the module docstring)::

            all = post-stratified treated - holdout          (`_all_lift`)
            sbm = Σ_s (n_powerful,s / n_T) gain_s
            precompute = share of answers used · (used - withheld)   (`answer_lift`; only
                         where visits held answers, with ``precompute_per_hit``; until
                         it is measured there, ``rma`` is not either)
            rma = all - sbm - precompute,   rma_per_extra = rma / mean extras sent

        Each needs ``min_labels`` treated rounds (and holdout ones for ``all`` and ``rma``);
        a segment counts toward ``sbm`` with ``min_labels`` requests' worth of labels on both
        of its arms: min_labels · n_T / Σv labels (min_labels at full logging), since a sampled
        label stands for 1/inclusion requests. Counting labels instead left out, at 1%, the
        very segments SBM pays most in: routed to the powerful model at p 0.98, their baseline
        arm logs a few dozen labels a run (azure_steady: sbm read 0.036 for a true 0.096, and
        its interval missed in 10 of 10 seeds); their gain's shrunk variance says how little
        those labels tell."""
        t, h, z = self._treated, self._holdout, self._z
        k = self.labels.min_labels
        out = {"all": Estimate(), "sbm": Estimate(), "rma": Estimate(),
               "rma_per_extra": Estimate()}
        if t.n >= k:
            sbm_mean = sbm_var = 0.0
            counted: list[tuple[float, float]] = []
            arm_k = k * (t.n / t.w)     # k requests' worth of labels (k at full logging)
            for name in sorted(self._segments):
                arms = self._segments[name]
                est = self.gain(name)
                if (est.measured is None or est.std is None or arms.baseline.n < arm_k
                        or arms.powerful.n < arm_k):
                    continue
                share = arms.powerful_total / t.w
                sbm_mean += share * est.measured
                sbm_var += share * share * est.std ** 2
                counted.append((arms.powerful_total, est.measured))
            if sampled(t):
                sbm_var += sbm_share_var(counted, sbm_mean, t)
            out["sbm"] = estimate(sbm_mean, sbm_var, z)
            pre_mean = pre_var = 0.0
            separable = True    # RMA's share can be told apart from the others'
            if self._answers.seen:
                out["precompute_per_hit"], pre = self._answers.lift(t, k, z)
                out["precompute"] = pre
                if pre.measured is not None and pre.std is not None:
                    pre_mean, pre_var = pre.measured, pre.std ** 2
                else:   # answers pay some of the lift, and how much is not measured yet
                    separable = False
            if h.n >= k:
                total_mean, total_var = self._all_lift()
                out["all"] = estimate(total_mean, total_var, z)
                rma = (estimate(total_mean - sbm_mean - pre_mean, total_var + sbm_var + pre_var,
                                z) if separable else Estimate())
                out["rma"] = rma
                extra = self._treated_extra / t.w
                if extra > 0 and rma.measured is not None and rma.std is not None:
                    out["rma_per_extra"] = estimate(rma.measured / extra,
                                                     (rma.std / extra) ** 2, z)
        return out

    def precompute_per_hit(self) -> Estimate:
        """What using a precompute answer adds to a visit (``lift()['precompute_per_hit']``,
        alone: the precompute lever's share reads it every period)."""
        t = self._treated
        k = self.labels.min_labels
        if not self._answers.seen or t.n < k:
            return Estimate()
        return self._answers.lift(t, k, self._z)[0]

    def _all_lift(self) -> tuple[float, float]:
        """Treated minus holdout, post-stratified by segment: ``(mean, variance)``
        (`streams.control.strata`)."""
        return post_stratified(self._strata, self._unstratified, self._treated,
                               self._holdout, self.labels.min_labels)

    def counts(self) -> dict[str, int]:
        return {"treated": round(self._treated.n), "holdout": round(self._holdout.n)}

    @property
    def state(self) -> EstimatesState:
        return EstimatesState(segments={k: self._segments[k] for k in sorted(self._segments)},
                              treated=self._treated, holdout=self._holdout,
                              treated_extra=self._treated_extra,
                              strata={k: self._strata[k] for k in sorted(self._strata)},
                              unstratified=self._unstratified, answers=self._answers.state)


def lift_report(scope: str, ts_ms: int, epoch: int, est: GainEstimator,
                join: dict[str, int], curves_learned: bool) -> LiftReport:
    """The wire form of a scope's measured lift and join counts (estimates topic, event log)."""
    def clip(x: float | None) -> float | None:
        return None if x is None else max(-1e9, min(1e9, x))

    def wire(e: Estimate) -> LiftEstimate:
        return LiftEstimate(measured=clip(e.measured), ci_low=clip(e.ci_low),
                            ci_high=clip(e.ci_high))

    counts = est.counts()
    return LiftReport(v=DECISION_VERSION, scope=scope, ts_ms=ts_ms, epoch=epoch,
                      lift={k: wire(v) for k, v in sorted(est.lift().items())},
                      join=dict(sorted(join.items())), treated=counts["treated"],
                      holdout=counts["holdout"], curves_learned=curves_learned)
