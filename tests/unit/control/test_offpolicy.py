"""`streams.control.offpolicy` against the formulas its docstrings state, each computed again
here directly with numpy over the same logged rounds.

SNIPS is also checked against Open Bandit Pipeline's
``SelfNormalizedInverseProbabilityWeighting`` (obp 0.4.1). obp is not a test dependency: it
requires torch, scikit-learn, pandas, matplotlib and seaborn, and its newest release installs
an old PyYAML from source. Its two estimates of `logged_rounds` (the policies "always
baseline" and "always powerful", ``action_dist`` one-hot, ``pscore`` the logged propensity)
were computed once in a virtualenv of its own and are `OBP_SNIPS` below:

    SelfNormalizedInverseProbabilityWeighting().estimate_policy_value(
        reward=y, action=arm, pscore=p, action_dist=one_hot(arm_evaluated))
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from schemas.contract import DECISION_VERSION, RoutingOutcome
from streams.control.config import LabelsConfig, SbmConfig
from streams.control.moments import SCALES, best_scale, merge
from streams.control.offpolicy import GainEstimator, Moments, adjusted_gain

#: obp's SNIPS estimate of each deterministic policy on `logged_rounds()`.
OBP_SNIPS = {"baseline": 0.3358416607692316, "powerful": 0.5286044576693532}


def logged_rounds(n: int = 240) -> list[tuple[str, float, int, float]]:
    """(model, propensity, extra candidates, value) of ``n`` logged rounds of one segment,
    from a 32-bit linear congruential generator (no RNG library, so the sample is the same
    everywhere and obp saw the same one): P(powerful) in 0.1-0.9, powerful worth +0.25,
    extras +0.05 at most, uniform noise of width 1."""
    state = 12345

    def u() -> float:
        nonlocal state
        state = (1103515245 * state + 12345) % (1 << 31)
        return state / (1 << 31)

    rounds = []
    for _ in range(n):
        p_powerful = round(0.1 + 0.8 * u(), 4)
        powerful = u() < p_powerful
        extra = int(u() * 40)
        value = round(0.3 + (0.25 if powerful else 0.0) + 0.05 * (extra / 40) + (u() - 0.5), 4)
        rounds.append(("powerful" if powerful else "baseline",
                       p_powerful if powerful else round(1 - p_powerful, 4), extra, value))
    return rounds


def _arrays(model: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights 1/p, covariates log1p(extras) and values of one arm's rounds."""
    rows = [(1.0 / p, math.log1p(e), y) for m, p, e, y in logged_rounds() if m == model]
    w, x, y = (np.array(col) for col in zip(*rows, strict=True))
    return w, x, y


def _moments(model: str, max_n: float = math.inf) -> Moments:
    m = Moments()
    for arm, p, extra, y in logged_rounds():
        if arm == model:
            m = m.add(y, 1.0 / p, max_n, extra)
    return m


def _decision(i: int, model: str, propensity: float, extra: int, value: float, *,
              segment: str = "s", holdout: bool = False) -> RoutingOutcome:
    return RoutingOutcome(v=DECISION_VERSION, ts_ms=0, scope="eu1", request_id=f"r{i}",
                          segment=segment, model=model,  # type: ignore[arg-type]
                          propensity=propensity, holdout=holdout, extra=extra, value=value)


@pytest.mark.parametrize("model", ["baseline", "powerful"])
def test_snips_mean_and_delta_variance_match_the_textbook_and_obp(model: str) -> None:
    w, _, y = _arrays(model)
    mu = float(np.sum(w * y) / np.sum(w))                       # Σ w y / Σ w
    n = len(y)
    var = float(np.sum(w**2 * (y - mu) ** 2) / np.sum(w) ** 2 * n / (n - 1))
    m = _moments(model)
    assert m.mean == pytest.approx(mu, abs=1e-12)
    assert m.mean == pytest.approx(OBP_SNIPS[model], abs=1e-12)
    assert m.var_of_mean == pytest.approx(var, rel=1e-9)


def test_shrunk_variance_is_kish_size_and_prior_noise() -> None:
    w, _, y = _arrays("powerful")
    mu = np.sum(w * y) / np.sum(w)
    n_eff = np.sum(w) ** 2 / np.sum(w**2)
    s2 = np.sum(w**2 * (y - mu) ** 2) / np.sum(w**2)
    want = (n_eff * s2 + 10.0 * 0.25) / (n_eff + 10.0) / n_eff
    assert _moments("powerful").shrunk_var_of_mean(0.25, 10.0) == pytest.approx(want, rel=1e-9)


def test_regression_adjusted_gain_is_pooled_within_arm_least_squares() -> None:
    arms = {model: _arrays(model) for model in ("baseline", "powerful")}
    xbar = {m: np.sum(w * x) / np.sum(w) for m, (w, x, _) in arms.items()}
    mu = {m: np.sum(w * y) / np.sum(w) for m, (w, _, y) in arms.items()}
    sxx = sum(np.sum(w * (x - xbar[m]) ** 2) for m, (w, x, _) in arms.items())
    sxy = sum(np.sum(w * (x - xbar[m]) * (y - mu[m])) for m, (w, x, y) in arms.items())
    syy = sum(np.sum(w * (y - mu[m]) ** 2) for m, (w, _, y) in arms.items())
    beta = max(sxy / sxx, 0.0)
    dx = xbar["powerful"] - xbar["baseline"]
    n_eff = sum(np.sum(w) ** 2 / np.sum(w**2) for w, _, _ in arms.values())
    gain, added = adjusted_gain(_moments("baseline"), _moments("powerful"))
    assert beta > 0
    assert gain == pytest.approx(mu["powerful"] - mu["baseline"] - beta * dx, abs=1e-12)
    assert added == pytest.approx(dx * dx * (syy - beta * sxy) / (n_eff * sxx), rel=1e-9)


def test_a_segments_gain_is_the_adjusted_snips_difference() -> None:
    est = GainEstimator(SbmConfig(), LabelsConfig())
    for i, (model, p, extra, y) in enumerate(logged_rounds()):
        est.observe(_decision(i, model, p, extra, y))
    gain = est.gain("s")
    want, _ = adjusted_gain(_moments("baseline"), _moments("powerful"))
    assert gain.measured == pytest.approx(want, abs=1e-12)
    # With no extras at all the adjustment vanishes and the gain is obp's difference.
    plain = GainEstimator(SbmConfig(), LabelsConfig())
    for i, (model, p, _, y) in enumerate(logged_rounds()):
        plain.observe(_decision(i, model, p, 0, y))
    assert plain.gain("s").measured == pytest.approx(
        OBP_SNIPS["powerful"] - OBP_SNIPS["baseline"], abs=1e-12)


def test_the_priority_is_the_precision_weighted_posterior() -> None:
    cfg = SbmConfig(prior_std=0.3)
    est = GainEstimator(cfg, LabelsConfig())
    for i, (model, p, extra, y) in enumerate(logged_rounds()):
        est.observe(_decision(i, model, p, extra, y))
    g = est.gain("s")
    assert g.measured is not None and g.std is not None
    v0, v = 2 * 0.3**2, g.std**2
    prior = est.priority("s", fleet_gain=0.1)
    assert prior.gain_mean == pytest.approx((0.1 / v0 + g.measured / v) / (1 / v0 + 1 / v))
    assert prior.gain_std == pytest.approx(math.sqrt(1 / (1 / v0 + 1 / v)))


def test_the_lift_is_post_stratified_by_segment_with_welch_variances() -> None:
    """Two segments worth different amounts, holdouts in different shares: the lift is the
    treated-share-weighted sum of within-segment differences, not the pooled difference."""
    est = GainEstimator(SbmConfig(), LabelsConfig(min_labels=10))
    rows: dict[tuple[str, bool], list[float]] = {}
    for i, (_, _, extra, y) in enumerate(logged_rounds(600)):
        segment = "a" if i % 3 else "b"
        holdout = (i % 7 == 0) if segment == "a" else (i % 4 == 0)
        value = y + (1.0 if segment == "b" else 0.0) + (0.0 if holdout else 0.2)
        est.observe(_decision(i, "baseline", 1.0, extra, value, segment=segment,
                              holdout=holdout))
        rows.setdefault((segment, holdout), []).append(value)
    n_t = sum(len(rows[(s, False)]) for s in ("a", "b"))
    mean = var = 0.0
    for s in ("a", "b"):
        t, h = np.array(rows[(s, False)]), np.array(rows[(s, True)])
        share = len(t) / n_t
        mean += share * (t.mean() - h.mean())
        var += share**2 * (t.var(ddof=1) / len(t) + h.var(ddof=1) / len(h))
    lift = est.lift()["all"]
    assert lift.measured == pytest.approx(mean, abs=1e-9)
    assert lift.std == pytest.approx(math.sqrt(var), rel=1e-9)
    pooled = (np.mean(rows[("a", False)] + rows[("b", False)])
              - np.mean(rows[("a", True)] + rows[("b", True)]))
    assert abs(pooled - mean) > 0.05       # the segment mix would have biased the plain one


def test_drift_scaling_is_an_exponential_window_of_max_n_rounds() -> None:
    """Past n_max rounds each sum is scaled by (n_max - 1)/n before a round is added: the
    sums equal those of every round weighted by the product of the scalings after it."""
    max_n = 50.0
    w, x, y = _arrays("powerful")
    decay = np.ones(len(y))
    n = 0.0
    for i in range(len(y)):
        if n + 1.0 > max_n:
            decay[:i] *= (max_n - 1.0) / n
            n = max_n
        else:
            n += 1.0
    m = _moments("powerful", max_n)
    assert m.n == pytest.approx(max_n)
    assert m.w == pytest.approx(float(np.sum(decay * w)), rel=1e-9)
    assert m.mean == pytest.approx(float(np.sum(decay * w * y) / np.sum(decay * w)), rel=1e-9)
    assert m.mean_x == pytest.approx(float(np.sum(decay * w * x) / np.sum(decay * w)), rel=1e-9)
    # At n = n_max a round k rounds old weighs (1 - 1/n_max)^k.
    assert decay[-11] / decay[-1] == pytest.approx((1 - 1 / max_n) ** 10)


def test_every_scale_of_the_covariate_keeps_its_sums_through_drift_and_merge() -> None:
    """The sums at each scale are those of x = log1p(extras / scale), scaled with the rest
    past max_n, and merged element by element (a side without any reads as zeros)."""
    rounds = [(y, 1.0 / p, float(e)) for _, p, e, y in logged_rounds()]
    m = Moments()
    for y, w, e in rounds:
        m = m.add(y, w, 50.0, e)
    plain = Moments()
    for k, scale in enumerate(SCALES):
        at = m.at(k)
        one = Moments()
        for y, w, e in rounds:
            one = one.add(y, w, 50.0, e / scale)   # the same rounds, at scale 1
        assert (at.wx, at.wxx, at.wxy) == pytest.approx((one.wx, one.wxx, one.wxy), rel=1e-9)
        assert merge(at, plain).mean_x == pytest.approx(at.mean_x)
    half = len(rounds) // 2
    a, b = Moments(), Moments()
    for y, w, e in rounds[:half]:
        a = a.add(y, w, math.inf, e)
    for y, w, e in rounds[half:]:
        b = b.add(y, w, math.inf, e)
    whole = Moments()
    for y, w, e in rounds:
        whole = whole.add(y, w, math.inf, e)
    assert merge(a, b).wxs == pytest.approx(whole.wxs, rel=1e-9)
    assert merge(a, Moments()).wxs == a.wxs


def test_the_scale_that_fits_the_outcomes_is_chosen() -> None:
    """Outcomes on ln(1 + k/64) pick 64 among the scales; outcomes with no covariate at all
    pick the first."""
    rng = np.random.default_rng(3)
    base, powerful = Moments(), Moments()
    for _ in range(5000):
        extra = float(rng.integers(0, 1000))
        y = 0.1 * math.log1p(extra / 64.0) + rng.normal(0.0, 0.01)
        if rng.random() < 0.5:
            base = base.add(y, 2.0, math.inf, extra)
        else:
            powerful = powerful.add(y + 0.02, 2.0, math.inf, extra)
    assert SCALES[best_scale([(base, powerful)])] == 64.0
    flat = Moments().add(1.0).add(2.0)
    assert best_scale([(flat, flat)]) == 0 and best_scale([]) == 0
