"""The estimators on sampled decision records (``inclusion`` < 1): each formula of the
``Sampled decision records`` section of `streams.control.offpolicy` computed again here with
numpy over the same rounds, and the lift's interval covering the truth over repeated samples
of one population at a 5% sample rate."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from msgspec import UNSET

from schemas.contract import SAMPLED_VERSION, RoutingOutcome
from streams.control.config import LabelsConfig, SbmConfig
from streams.control.moments import Moments
from streams.control.offpolicy import GainEstimator


def _decision(i: int, model: str, propensity: float, value: float, *, segment: str = "s",
              holdout: bool = False, inclusion: float = 1.0, extra: int = 0) -> RoutingOutcome:
    sampled = inclusion < 1.0
    return RoutingOutcome(v=SAMPLED_VERSION, ts_ms=0, scope="eu1", request_id=f"r{i}",
                          segment=segment, model=model,  # type: ignore[arg-type]
                          propensity=propensity, holdout=holdout, extra=extra, value=value,
                          inclusion=inclusion if sampled else UNSET)


def _rows(n: int, seed: int) -> list[tuple[str, bool, float, float]]:
    """(segment, holdout, inclusion, value) of ``n`` logged rounds: segment b is worth 1 more
    and gains 0.4 from optional work where a gains 0.1; two clients log at 0.5 and 0.1."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        segment = "a" if rng.random() < 0.6 else "b"
        holdout = bool(rng.random() < 0.3)
        inclusion = 1.0 if holdout else (0.5 if i % 2 else 0.1)
        value = (1.0 if segment == "b" else 0.0) + rng.normal(0.0, 0.5)
        if not holdout:
            value += 0.4 if segment == "b" else 0.1
        rows.append((segment, holdout, inclusion, value))
    return rows


def test_the_sampled_lift_is_hajek_weighted_and_adds_the_shares_variance() -> None:
    est = GainEstimator(SbmConfig(), LabelsConfig(min_labels=10))
    rows = _rows(800, 3)
    for i, (segment, holdout, inclusion, value) in enumerate(rows):
        est.observe(_decision(i, "baseline", 1.0, value, segment=segment, holdout=holdout,
                              inclusion=inclusion))
    v_all = np.array([1 / p for _, h, p, _ in rows if not h])
    parts = {}
    for s in ("a", "b"):
        t = np.array([(1 / p, y) for seg, h, p, y in rows if seg == s and not h])
        hy = np.array([y for seg, h, _, y in rows if seg == s and h])
        v, y = t[:, 0], t[:, 1]
        mu = np.sum(v * y) / np.sum(v)                                 # Hajek mean
        var_t = np.sum(v**2 * (y - mu) ** 2) / np.sum(v) ** 2 * len(y) / (len(y) - 1)
        parts[s] = (np.sum(v) / np.sum(v_all), mu - hy.mean(), var_t + hy.var(ddof=1) / len(hy),
                    np.sum(v**2))
    lift = sum(w * d for w, d, _, _ in parts.values())
    var = sum(w * w * vk for w, _, vk, _ in parts.values())
    var += sum((d - lift) ** 2 * v2 for _, d, _, v2 in parts.values()) / np.sum(v_all) ** 2
    got = est.lift()["all"]
    assert got.measured == pytest.approx(lift, abs=1e-12)
    assert got.std == pytest.approx(math.sqrt(var), rel=1e-9)


def test_one_sample_rate_cancels_out_of_the_gains() -> None:
    """SNIPS, its variance and the adjustment are ratios in w = v/p: a scope logged at one
    rate gets the gain (and interval) its unsampled records would give."""
    rng = np.random.default_rng(5)
    full, sampled = GainEstimator(SbmConfig(), LabelsConfig()), GainEstimator(SbmConfig(),
                                                                             LabelsConfig())
    for i in range(400):
        p = 0.2 + 0.6 * rng.random()
        powerful = bool(rng.random() < p)
        extra = int(rng.integers(0, 30))
        value = 0.3 + (0.2 if powerful else 0.0) + 0.01 * extra + rng.normal(0, 0.3)
        model, prop = ("powerful", p) if powerful else ("baseline", 1 - p)
        full.observe(_decision(i, model, prop, value, extra=extra))
        sampled.observe(_decision(i, model, prop, value, extra=extra, inclusion=0.01))
    a, b = full.gain("s"), sampled.gain("s")
    assert b.measured == pytest.approx(a.measured, rel=1e-9)
    assert b.std == pytest.approx(a.std, rel=1e-9)


def test_the_sbm_lift_adds_the_variance_of_its_estimated_shares() -> None:
    """One rate: Σ v² (c - sbm)² / (Σ v)² with c the segment's gain on its powerful rounds
    and 0 on the rest, exactly."""
    rng = np.random.default_rng(9)
    est = GainEstimator(SbmConfig(), LabelsConfig(min_labels=5))
    rate, c = 0.05, []
    for i in range(600):
        segment = "a" if i % 3 else "b"
        powerful = bool(rng.random() < 0.5)
        value = (0.3 if powerful and segment == "a" else 0.1 if powerful else 0.0) \
            + rng.normal(0, 0.2)
        est.observe(_decision(i, "powerful" if powerful else "baseline", 0.5, value,
                              segment=segment, inclusion=rate))
        c.append((segment, powerful))
    gains, stds = {}, {}
    for s in ("a", "b"):
        g = est.gain(s)
        assert g.measured is not None and g.std is not None
        gains[s], stds[s] = g.measured, g.std
    v = 1 / rate
    n = len(c)
    sbm = sum(v * gains[s] for s, pw in c if pw) / (v * n)
    share_var = sum(v * v * ((gains[s] if pw else 0.0) - sbm) ** 2
                    for s, pw in c) / (v * n) ** 2
    base_var = 0.0
    for s in ("a", "b"):
        share = sum(v for seg, pw in c if seg == s and pw) / (v * n)
        base_var += share**2 * stds[s] ** 2
    got = est.lift()["sbm"]
    assert got.measured == pytest.approx(sbm, abs=1e-12)
    assert got.std == pytest.approx(math.sqrt(base_var + share_var), rel=1e-9)


def test_full_logging_adds_nothing() -> None:
    """Every inclusion 1 (unset): Σv² = n, so no share term, as before sampling existed."""
    m = Moments()
    for y in (0.1, 0.5, 0.2):
        m = m.add(y, 1.0)
    assert m.w2 == m.n
    est = GainEstimator(SbmConfig(), LabelsConfig(min_labels=10))
    for i, (segment, holdout, _, value) in enumerate(_rows(400, 4)):
        est.observe(_decision(i, "baseline", 1.0, value, segment=segment, holdout=holdout))
    t = est.state.treated
    assert t.w2 == t.n


def test_the_sampled_lift_interval_covers_the_population_lift() -> None:
    """A population of 20,000 requests (5% holdout, two segments whose lifts differ) logged
    at 5% by request-id hash, 200 times: the 95% interval holds the population's own lift
    (the mean incremental value of its treated requests) in 90-99% of them."""
    from workers.policy.sampling import decision_inclusion
    z = NormalDist().inv_cdf(0.975)
    rng = np.random.default_rng(11)
    hits = 0
    reps = 200
    for rep in range(reps):
        n = 20_000
        segment_b = rng.random(n) < 0.4
        holdout = rng.random(n) < 0.05
        gain = np.where(segment_b, 0.6, 0.1)
        y0 = np.where(segment_b, 1.0, 0.0) + rng.normal(0.0, 0.5, n)
        y = y0 + np.where(holdout, 0.0, gain)
        truth = float(gain[~holdout].mean())
        est = GainEstimator(SbmConfig(), LabelsConfig(min_labels=10))
        for i in range(n):
            rid = f"{rep}-{i}"
            inclusion = decision_inclusion(rid, 0.05, bool(holdout[i]))
            if inclusion is None:
                continue
            est.observe(_decision(i, "baseline", 1.0, float(y[i]),
                                  segment="b" if segment_b[i] else "a",
                                  holdout=bool(holdout[i]), inclusion=inclusion))
        got = est.lift()["all"]
        assert got.measured is not None and got.std is not None
        hits += abs(got.measured - truth) <= z * got.std
    assert 0.90 * reps <= hits <= 0.99 * reps


def test_a_segment_counts_toward_sbm_with_min_labels_requests_worth_on_each_arm() -> None:
    """At rate 0.1 a label stands for 10 requests: 5 baseline labels are 50 requests' worth,
    past min_labels 30, so the segment's gain counts (at full logging it would not)."""
    rng = np.random.default_rng(2)
    rows = [("powerful", 0.95, 0.5 + rng.normal(0, 0.1)) for _ in range(100)]
    rows += [("baseline", 0.05, 0.1 + rng.normal(0, 0.1)) for _ in range(5)]
    sampled = GainEstimator(SbmConfig(), LabelsConfig(min_labels=30))
    full = GainEstimator(SbmConfig(), LabelsConfig(min_labels=30))
    for i, (model, p, y) in enumerate(rows):
        sampled.observe(_decision(i, model, p, y, inclusion=0.1))
        full.observe(_decision(i, model, p, y))
    gain = sampled.gain("s").measured
    assert gain is not None and gain > 0.3
    assert sampled.lift()["sbm"].measured == pytest.approx(gain * 100 / 105, rel=1e-9)
    assert full.lift()["sbm"].measured == 0.0
