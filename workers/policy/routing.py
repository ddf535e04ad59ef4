"""Value-aware SBM routing: which requests go to the powerful model, so that the control plane's
coverage share is met on average while the segments that gain most from it go first.

Every `recompute_every` requests (and whenever the targets or the client's allowance change) the
router builds a *plan*, one pair of thresholds per segment:

1. traffic shares per segment from exponentially decayed request counts;
2. a gain per segment drawn by Thompson sampling from a Normal posterior that combines the
   control plane's priority (gain_mean, gain_std) with this client's own observed values on both
   models (precision-weighted; the local evidence decays, so it sharpens recent estimates
   rather than piling onto what the control plane already learnt from the same outcomes);
3. water-filling: the coverage budget, less an exploration slice, is poured over the segments
   from the highest sampled gain down, each taking at most all of its traffic;
4. exploration: `explore_rate` of the powerful-routed traffic goes to the traffic the fill did
   not choose, spread evenly over it, flagged `explored` so the control plane can learn from it;
5. a floor: every segment keeps `baseline_floor` of its requests on the baseline model, so the
   off-policy estimate sees both arms of every segment at random, none at a vanishing
   propensity (whose inverse would weigh one label above all the others).

Per request the router does one dict lookup and compares one pre-drawn uniform number with the
segment's thresholds, which keeps the whole client decision within its 10 µs budget.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec
import numpy as np
from msgspec import Meta

from schemas.contract import SegmentPriority
from workers.policy.targets import EffectiveTargets

Model = Literal["baseline", "powerful"]
OTHER_SEGMENT = "__other__"


class RouterConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """How the router balances exploitation, exploration and the cost of replanning."""

    #: Share of powerful-routed traffic sent to segments the fill did not choose.
    explore_rate: Annotated[float, Meta(ge=0.0, le=0.5)] = 0.05
    #: Share of every segment's requests kept on the baseline model whatever the coverage.
    #: The off-policy gain weighs a request by the inverse of its logged propensity: a
    #: segment routed to the powerful model with probability 0.9999 logs the odd baseline
    #: request at weight 10,000, one label then outweighs tens of thousands (Kish's effective
    #: size of 1, seen in `azure_steady`), and its gain is noise. The floor bounds that
    #: weight at 1/floor; it costs the floor's share of the gain where coverage is full.
    baseline_floor: Annotated[float, Meta(ge=0.0, le=0.5)] = 0.02
    #: Replan (fresh Thompson draws, fresh traffic shares) after this many requests.
    recompute_every: Annotated[int, Meta(ge=16, le=1_000_000)] = 2048
    #: Traffic counts and local outcome statistics lose half their weight after this many
    #: requests, so shares and gains follow drift.
    half_life_requests: Annotated[float, Meta(gt=0.0)] = 50_000.0
    #: Distinct named segments tracked; further ones share the OTHER_SEGMENT entry.
    max_segments: Annotated[int, Meta(ge=1, le=100_000)] = 10_000
    #: Prior std of the gain of a segment the control plane has not ranked, when it has ranked
    #: none at all (otherwise the spread of its ranked segments is used).
    unknown_gain_std: Annotated[float, Meta(gt=0.0)] = 1.0
    #: Local observations a model needs in a segment before they count as evidence.
    min_observations: Annotated[int, Meta(ge=2)] = 10
    #: An allowance rise smaller than this does not trigger a replan (falls always do).
    allowance_step: Annotated[float, Meta(gt=0.0, le=1.0)] = 0.05
    #: Uniform numbers drawn from the generator at once (amortises numpy's call cost).
    draw_block: Annotated[int, Meta(ge=1, le=1_000_000)] = 4096


class RouteDecision(msgspec.Struct, frozen=True):
    """Where one request goes; `shed` is set when client-side shedding kept it off `powerful`."""

    model: Model
    explored: bool = False
    shed: bool = False


BASELINE = RouteDecision("baseline")
POWERFUL = RouteDecision("powerful")
EXPLORED = RouteDecision("powerful", explored=True)
SHED = RouteDecision("baseline", shed=True)

# (exploit threshold, powerful threshold incl. exploration, threshold with full allowance)
Thresholds = tuple[float, float, float]


class _Outcomes:
    """Decayed count, sum and sum of squares of observed values of one (segment, model)."""

    __slots__ = ("n", "sq", "total")

    def __init__(self) -> None:
        self.n = 0.0
        self.total = 0.0
        self.sq = 0.0

    def add(self, value: float) -> None:
        self.n += 1.0
        self.total += value
        self.sq += value * value

    def decay(self, factor: float) -> None:
        self.n *= factor
        self.total *= factor
        self.sq *= factor

    def mean_and_var_of_mean(self) -> tuple[float, float]:
        mean = self.total / self.n
        var = max(self.sq / self.n - mean * mean, 0.0) * self.n / max(self.n - 1.0, 1.0)
        return mean, max(var, 1e-12) / self.n


class SbmRouter:
    """Routes each request to the baseline or the powerful pool; deterministic given `seed`."""

    def __init__(self, config: RouterConfig, seed: int) -> None:
        self.config = config
        self._rng = np.random.default_rng(seed)
        self._uniforms: list[float] = []
        self._next_uniform = 0
        self._window: dict[str, int] = {}
        self._known: set[str] = set()
        self._traffic: dict[str, float] = {}
        self._outcomes: dict[tuple[str, Model], _Outcomes] = {}
        self._plan: dict[str, Thresholds] = {}
        self._default: Thresholds = (0.0, 0.0, 0.0)
        self._planned_for: EffectiveTargets | None = None
        self._planned_allowance = 1.0
        self._since_plan = 0
        self._replan_after = 16
        self.replans = 0
        self.sampled_gains: dict[str, float] = {}
        #: P(powerful) the last `route` drew against: the logged propensity of its choice.
        self.last_p = 0.0

    # ---- per request -------------------------------------------------------------------------

    def route(self, segment: str, eff: EffectiveTargets, allowance: float = 1.0) -> RouteDecision:
        """Pick the pool for one request of `segment` under `eff`, shrunk by `allowance`."""
        window = self._window
        if segment in window:
            window[segment] += 1
        else:
            segment = self._admit_segment(segment)
        self._since_plan += 1
        if eff.baseline_only or eff.coverage <= 0.0:
            self.last_p = 0.0
            return BASELINE
        if (eff is not self._planned_for or self._since_plan >= self._replan_after
                or allowance < self._planned_allowance
                or allowance >= self._planned_allowance + self.config.allowance_step):
            self._replan(eff, allowance)
        exploit, powerful, full = self._plan.get(segment, self._default)
        self.last_p = powerful
        u = self._draw()
        if u < exploit:
            return POWERFUL
        if u < powerful:
            return EXPLORED
        if u < full:
            return SHED
        return BASELINE

    def observe(self, segment: str, model: Model, value: float) -> None:
        """Record the value observed for a request routed to `model` (Thompson evidence)."""
        if not math.isfinite(value):
            return
        if segment not in self._known:
            if len(self._known) >= self.config.max_segments:
                segment = OTHER_SEGMENT
            self._known.add(segment)
        key = (segment, model)
        stats = self._outcomes.get(key)
        if stats is None:
            stats = self._outcomes[key] = _Outcomes()
        stats.add(value)

    def _admit_segment(self, segment: str) -> str:
        """Count a segment seen for the first time in this window, within `max_segments`."""
        if segment not in self._known:
            if len(self._known) >= self.config.max_segments:
                segment = OTHER_SEGMENT
            self._known.add(segment)
        self._window[segment] = self._window.get(segment, 0) + 1
        return segment

    def _draw(self) -> float:
        i = self._next_uniform
        if i >= len(self._uniforms):
            self._uniforms = self._rng.random(self.config.draw_block).tolist()
            i = 0
        self._next_uniform = i + 1
        return self._uniforms[i]

    # ---- planning ----------------------------------------------------------------------------

    @property
    def plan(self) -> dict[str, Thresholds]:
        """Per segment: P(powerful, exploited), P(powerful), P(powerful) without shedding."""
        return dict(self._plan)

    def shares(self) -> dict[str, float]:
        """Decayed traffic share of each segment, including the current window."""
        counts = dict(self._traffic)
        for seg, n in self._window.items():
            counts[seg] = counts.get(seg, 0.0) + n
        total = sum(counts.values())
        return {seg: c / total for seg, c in counts.items()} if total > 0 else {}

    def _replan(self, eff: EffectiveTargets, allowance: float) -> None:
        factor = 0.5 ** (self._since_plan / self.config.half_life_requests)
        self._fold_window(factor)
        for stats in self._outcomes.values():
            stats.decay(factor)
        shares = self.shares()
        gains = self._sample_gains(list(shares), eff.segments)
        allowance = min(max(allowance, 0.0), 1.0)
        reduced = self._thresholds(shares, gains, eff.coverage * allowance)
        full = reduced if allowance >= 1.0 else self._thresholds(shares, gains, eff.coverage)
        self._plan = {seg: (e, p, max(p, full[seg][1])) for seg, (e, p) in reduced.items()}
        self._default = self._default_thresholds(shares, reduced, eff.coverage * allowance,
                                                 eff.coverage)
        self.sampled_gains = gains
        self._planned_for = eff
        self._planned_allowance = allowance
        self._since_plan = 0
        self._replan_after = min(self._replan_after * 2, self.config.recompute_every)
        self.replans += 1

    def _fold_window(self, factor: float) -> None:
        traffic = self._traffic
        for seg in traffic:
            traffic[seg] *= factor
        for seg, n in self._window.items():
            traffic[seg] = traffic.get(seg, 0.0) + n
        self._window = {}

    def _sample_gains(self, segments: list[str],
                      priorities: dict[str, SegmentPriority]) -> dict[str, float]:
        """One Thompson draw of each segment's gain from its Normal posterior."""
        if not segments:
            return {}
        means = np.empty(len(segments))
        stds = np.empty(len(segments))
        unknown = self._unknown_prior(priorities)
        for i, seg in enumerate(segments):
            p = priorities.get(seg)
            prior = unknown if p is None else (p.gain_mean, max(p.gain_std, 1e-9))
            means[i], stds[i] = self._posterior(seg, prior)
        draws = self._rng.normal(means, stds)
        return dict(zip(segments, draws.tolist(), strict=True))

    def expected_gain(self, segment: str, eff: EffectiveTargets) -> float:
        """The posterior mean of `segment`'s gain from the powerful model (the control plane's
        estimate with this client's own evidence): the order its requests are shed in."""
        p = eff.segments.get(segment)
        prior = (self._unknown_prior(eff.segments) if p is None
                 else (p.gain_mean, max(p.gain_std, 1e-9)))
        return self._posterior(segment, prior)[0]

    def _unknown_prior(self, priorities: dict[str, SegmentPriority]) -> tuple[float, float]:
        """Prior for a segment the control plane has not ranked: the spread of those it has."""
        if not priorities:
            return 0.0, self.config.unknown_gain_std
        means = [p.gain_mean for p in priorities.values()]
        mean = sum(means) / len(means)
        spread = max(math.sqrt(sum((m - mean) ** 2 for m in means) / len(means)),
                     max(p.gain_std for p in priorities.values()), 1e-9)
        return mean, spread

    def _posterior(self, segment: str, prior: tuple[float, float]) -> tuple[float, float]:
        """Prior combined with this client's own powerful-minus-baseline evidence."""
        mean, std = prior
        powerful = self._outcomes.get((segment, "powerful"))
        baseline = self._outcomes.get((segment, "baseline"))
        k = self.config.min_observations
        if powerful is None or baseline is None or powerful.n < k or baseline.n < k:
            return mean, std
        mp, vp = powerful.mean_and_var_of_mean()
        mb, vb = baseline.mean_and_var_of_mean()
        prior_prec, local_prec = 1.0 / (std * std), 1.0 / (vp + vb)
        prec = prior_prec + local_prec
        return (mean * prior_prec + (mp - mb) * local_prec) / prec, math.sqrt(1.0 / prec)

    def _thresholds(self, shares: dict[str, float], gains: dict[str, float],
                    coverage: float) -> dict[str, tuple[float, float]]:
        """Water-fill `coverage` (less exploration) by sampled gain, then spread exploration."""
        coverage = min(max(coverage, 0.0), 1.0)
        budget = coverage * (1.0 - self.config.explore_rate)
        cap = 1.0 - self.config.baseline_floor
        exploit: dict[str, float] = {}
        for seg in sorted(shares, key=lambda s: (-gains[s], s)):
            share = shares[seg]
            p = 0.0 if share <= 0.0 else min(cap, budget / share)
            exploit[seg] = p
            budget = max(budget - p * share, 0.0)
        used = sum(exploit[s] * shares[s] for s in shares)
        unchosen = sum((cap - exploit[s]) * shares[s] for s in shares)
        x = 0.0 if unchosen <= 1e-12 else min(1.0, max(coverage - used, 0.0) / unchosen)
        return {s: (e, e + (cap - e) * x) for s, e in exploit.items()}

    def _default_thresholds(self, shares: dict[str, float],
                            reduced: dict[str, tuple[float, float]], coverage: float,
                            full_coverage: float) -> Thresholds:
        """Thresholds for a segment first seen since the plan: explore it, like unchosen ones."""
        cap = 1.0 - self.config.baseline_floor
        if not shares:
            # No traffic seen yet: coverage spread evenly, its exploration slice flagged.
            coverage, full_coverage = min(coverage, cap), min(full_coverage, cap)
            exploit = coverage * (1.0 - self.config.explore_rate)
            return exploit, coverage, full_coverage
        x = max((p - e) / (cap - e) for e, p in reduced.values() if e < cap) \
            if any(e < cap for e, _ in reduced.values()) else 0.0
        return 0.0, cap * x, cap * x
