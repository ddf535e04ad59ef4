"""The decision/label join and the off-policy estimates made from it (pure code, no clock)."""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from schemas.codec import ContractError, decode_labels, decode_outcomes, encode, encode_outcomes
from schemas.contract import DECISION_VERSION, OutcomeLabel, RoutingOutcome
from streams.control.config import ControlConfig, LabelsConfig, SbmConfig
from streams.control.controller import ScopeController, ScopeMismatch
from streams.control.dispatch import RULES, Rejected, dispatch, dispatch_all
from streams.control.labels import AttributionJoin
from streams.control.moments import SCALES
from streams.control.offpolicy import GainEstimator
from workers.policy.holdout import in_holdout

SCOPE = "eu1"
MIN = 60_000


def decision(rid: str, ts: int = 0, *, segment: str = "s", model: str = "baseline",
             propensity: float = 1.0, holdout: bool = False, extra: int = 0,
             value: float | None = None) -> RoutingOutcome:
    return RoutingOutcome(v=DECISION_VERSION, ts_ms=ts, scope=SCOPE, request_id=rid,
                          segment=segment, model=model,  # type: ignore[arg-type]
                          propensity=propensity, holdout=holdout, extra=extra, value=value)


def label(rid: str, value: float = 1.0, ts: int = 0) -> OutcomeLabel:
    return OutcomeLabel(ts_ms=ts, scope=SCOPE, request_id=rid, value=value)


# -- the join ----------------------------------------------------------------------------------

def test_a_label_in_the_window_joins_and_every_other_fate_is_counted_by_reason() -> None:
    check_every_fate(AttributionJoin(LabelsConfig(window_s=600)))


def check_every_fate(join: AttributionJoin) -> None:
    """Each fate of a decision and a label, on a join of a 600 s window and an empty store
    (also run on the disk store: tests/agents/test_pending_store.py)."""
    assert join.on_decision(decision("a"), 0) is None
    assert join.on_decision(decision("b"), 0) is None
    assert join.on_decision(decision("a"), 1) is None                # the same decision twice
    joined = join.on_label(label("a", 2.5), 9 * MIN)
    assert joined is not None and joined.value == 2.5 and joined.request_id == "a"
    assert join.on_label(label("a", 2.5), 9 * MIN) is None           # a retried label
    assert join.on_label(label("b"), 11 * MIN) is None               # past the window
    assert join.on_label(label("nobody"), 11 * MIN) is None          # never decided
    inline = join.on_decision(decision("c", value=0.5), 11 * MIN)    # knew it at once
    assert inline is not None and inline.value == 0.5
    assert join.on_decision(decision("d", 11 * MIN), 11 * MIN) is None
    join.expire(11 * MIN + 20 * MIN + 1)                             # two windows on
    assert join.on_label(label("d"), 32 * MIN) is None               # its decision is gone
    assert {k: v for k, v in join.counts.items() if v} == {
        "joined": 1, "duplicate": 1, "late": 1, "orphan": 2, "inline": 1,
        "duplicate_decision": 1, "unlabelled": 1}
    assert len(join) == 0


def test_labels_out_of_order_join_each_with_its_own_decision() -> None:
    join = AttributionJoin(LabelsConfig())
    for i in range(100):
        join.on_decision(decision(f"r{i}", i), i)
    values = {}
    for i in reversed(range(100)):
        joined = join.on_label(label(f"r{i}", float(i)), 1000 + i)
        assert joined is not None
        values[joined.request_id] = joined.value
    assert values == {f"r{i}": float(i) for i in range(100)}


def test_a_flood_of_unknown_labels_stores_nothing_and_decisions_stay_under_the_cap() -> None:
    join = AttributionJoin(LabelsConfig(max_pending=1000))
    tracemalloc.start()
    try:
        for i in range(200_000):
            join.on_label(label(f"unknown-{i}"), i)
        orphans_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        for i in range(50_000):
            join.on_decision(decision(f"d{i}", i), i)
        _, decisions_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(join) == 1000
    assert join.counts["orphan"] == 200_000 and join.counts["evicted"] == 49_000
    assert orphans_peak < 1 << 20              # counters only, whatever the flood's size
    assert decisions_peak < 2 << 20            # ~1000 entries, not 50,000
    # the newest are kept: the last decision still joins, the first does not
    assert join.on_label(label("d49999"), 50_000) is not None
    assert join.on_label(label("d0"), 50_000) is None


# -- the controller and the rulebook -----------------------------------------------------------

def test_labels_reach_the_estimates_through_the_rulebook_keyed_by_request_id() -> None:
    controller = ScopeController(SCOPE, ControlConfig())
    controllers = {SCOPE: controller}
    dispatch(RULES["outcomes"], SCOPE, decision("r1", model="powerful", propensity=0.5),
             controllers.__getitem__, 0)
    with pytest.raises(Rejected, match="neither the request id"):
        dispatch(RULES["labels"], "r2", label("r1"), controllers.__getitem__, 1)
    dispatch(RULES["labels"], "r1", label("r1", 3.0), controllers.__getitem__, 1)
    assert controller.join.counts["joined"] == 1
    with pytest.raises(ScopeMismatch):
        controller.on_label(OutcomeLabel(ts_ms=0, scope="us1", request_id="x", value=1.0), 0)
    state = controller.snapshot()
    assert state.estimates.segments["s"].powerful.n == 1.0
    restored = ScopeController(SCOPE, ControlConfig(), state)
    assert restored.estimates.state == controller.estimates.state


def test_a_batch_of_labels_is_keyed_by_its_scope() -> None:
    controller = ScopeController(SCOPE, ControlConfig())
    controllers = {SCOPE: controller}.__getitem__
    dispatch_all(RULES["outcomes"], SCOPE, [decision("a"), decision("b")], controllers, 0)
    batch = decode_labels(encode_outcomes([label("a", 1.0), label("b", 2.0)]))
    with pytest.raises(Rejected, match="a batch's key is its scope"):
        dispatch_all(RULES["labels"], "a", batch, controllers, 1)
    dispatch_all(RULES["labels"], SCOPE, batch, controllers, 1)
    assert controller.join.counts["joined"] == 2


def test_a_client_batch_of_decisions_decodes_strictly() -> None:
    batch = [decision("a"), decision("b", propensity=0.25)]
    assert decode_outcomes(encode_outcomes(batch)) == batch
    assert decode_outcomes(encode(batch[0])) == [batch[0]]
    with pytest.raises(ContractError, match="propensity"):
        decode_outcomes(encode_outcomes(batch).replace(b'"propensity":0.25',
                                                       b'"propensity":0.0'))


# -- holdout ------------------------------------------------------------------------------------

def test_the_holdout_is_a_stable_share_of_request_ids() -> None:
    picked = [in_holdout(f"eu1-{i}", 0.01) for i in range(50_000)]
    assert 0.008 < sum(picked) / len(picked) < 0.012
    assert picked == [in_holdout(f"eu1-{i}", 0.01) for i in range(50_000)]
    assert not any(in_holdout(f"eu1-{i}", 0.0) for i in range(1000))


# -- estimators ---------------------------------------------------------------------------------

def _rounds(rng: np.random.Generator, n: int, gains: dict[str, float],
            holdout: float = 0.01, rma: float = 0.2) -> tuple[list[RoutingOutcome], float]:
    """Logged rounds of a router whose P(powerful) depends on the segment *and* drifts with a
    value level (so a plain per-arm mean is biased), and the true lift per treated request."""
    segs = sorted(gains)
    out, true, treated = [], 0.0, 0
    for i in range(n):
        seg = segs[i % len(segs)]
        level = 1.0 if i < n // 2 else 2.0          # the value level moves half way
        p = 0.2 if level == 1.0 else 0.7            # ... and so does the coverage
        if rng.random() < holdout:
            out.append(decision(f"r{i}", segment=seg, holdout=True,
                                value=level + rng.normal(0.0, 1.0)))
            continue
        powerful = rng.random() < p
        gain = gains[seg] if powerful else 0.0
        out.append(decision(f"r{i}", segment=seg, model="powerful" if powerful else "baseline",
                            propensity=p if powerful else 1.0 - p, extra=8,
                            value=level + gain + rma + rng.normal(0.0, 1.0)))
        true += gain + rma
        treated += 1
    return out, true / treated


def test_snips_recovers_each_segment_gain_where_the_plain_mean_is_biased() -> None:
    gains = {"a": 0.1, "b": 0.5, "c": 1.0}
    covered = 0
    for seed in range(5):
        rounds, _ = _rounds(np.random.default_rng(seed), 30_000, gains, holdout=0.0)
        est = GainEstimator(SbmConfig(), LabelsConfig())
        for r in rounds:
            est.observe(r)
        for seg, gain in gains.items():
            g = est.gain(seg)
            assert g.ci_low is not None and g.ci_high is not None
            covered += g.ci_low <= gain <= g.ci_high
            pw = [r.value or 0.0 for r in rounds if r.segment == seg and r.model == "powerful"]
            bl = [r.value or 0.0 for r in rounds if r.segment == seg and r.model == "baseline"]
            assert float(np.mean(pw) - np.mean(bl)) - gain > 0.3   # the plain mean is far off
        order = sorted(gains, key=lambda s: est.priorities()[s].gain_mean)
        assert order == ["a", "b", "c"]
    assert covered >= 13, covered          # 95% intervals: 14.25 of 15 expected


def test_without_labels_the_prior_ranks_nothing_and_has_its_configured_spread() -> None:
    est = GainEstimator(SbmConfig(prior_std=0.5), LabelsConfig())
    est.observe(decision("x", segment="new", value=1.0))
    p = est.priorities()["new"]
    assert p.gain_mean == 0.0 and p.gain_std == pytest.approx(0.5 * 2 ** 0.5)


def test_the_true_lift_is_inside_the_measured_interval_in_at_least_9_of_10_seeds() -> None:
    """The goal's coverage, on logged rounds whose truth is known: 1% holdout by hash."""
    covered = {"all": 0, "sbm": 0}
    gains = {"a": 0.2, "b": 0.6}
    for seed in range(10):
        rng = np.random.default_rng(seed)
        rounds, true_all = _rounds(rng, 40_000, gains)
        est = GainEstimator(SbmConfig(), LabelsConfig())
        for r in rounds:
            est.observe(r)
        lift = est.lift()
        treated = [r for r in rounds if not r.holdout]
        true_sbm = sum(gains[r.segment] for r in treated if r.model == "powerful") / len(treated)
        for lever, true in (("all", true_all), ("sbm", true_sbm)):
            e = lift[lever]
            assert e.ci_low is not None and e.ci_high is not None
            covered[lever] += e.ci_low <= true <= e.ci_high
    assert covered["all"] >= 9 and covered["sbm"] >= 9, covered


def test_estimates_are_a_function_of_the_joined_decisions_only() -> None:
    rng = np.random.default_rng(3)
    rounds, _ = _rounds(rng, 5000, {"a": 0.3})
    one, two = (GainEstimator(SbmConfig(), LabelsConfig()) for _ in range(2))
    for r in rounds:
        one.observe(r)
        two.observe(r)
    assert msgspec.json.encode(one.state) == msgspec.json.encode(two.state)
    assert one.lift() == two.lift()


# -- the allocator's curves --------------------------------------------------------------------

def test_value_curves_stay_the_prior_until_both_levers_are_measured() -> None:
    from streams.control.value_curves import learned_curves

    kw: dict[str, Any] = {"rma_units_per_accel_s": 3500.0, "sbm_rps_per_accel": 20.0,
                          "request_rps": 100.0, "max_extra": 64.0}
    est = GainEstimator(SbmConfig(), LabelsConfig())
    assert learned_curves(est, **kw) is None                      # nothing measured yet
    rounds, _ = _rounds(np.random.default_rng(5), 40_000, {"a": 0.1, "b": 0.8})
    for r in rounds:
        est.observe(r)
    curves = learned_curves(est, **kw)
    assert curves is not None
    rma, sbm = curves
    # RMA: concave, out to the most extras a target may hold (64 a request at 100 rps)
    assert [v for _, v in rma] == sorted((v for _, v in rma), reverse=True) and len(rma) > 1
    assert sum(w for w, _ in rma) == pytest.approx(64.0 * 100.0 / 3500.0, rel=0.1)
    # ... and worth, at the 8 extras every round carried, the lift measured there
    lift = est.lift()["rma"].measured
    assert lift is not None
    assert _curve_value(rma, 8.0 * 100.0 / 3500.0) == pytest.approx(lift * 100.0, rel=0.1)
    # one piece per segment, the one that gains most first, worth its gain per powerful rps
    assert [v for _, v in sbm] == sorted((v for _, v in sbm), reverse=True)
    assert sbm[0][1] == pytest.approx(0.8 * 20.0, rel=0.15)
    assert sbm[1][1] == pytest.approx(0.1 * 20.0, rel=0.5)
    assert sum(w for w, _ in sbm) == pytest.approx(100.0 / 20.0, rel=0.1)


def _curve_value(curve: tuple[tuple[float, float], ...], units: float) -> float:
    """Value per second of ``units`` on a piecewise-linear concave curve."""
    value = 0.0
    for width, per_unit in curve:
        take = min(width, max(0.0, units))
        value += take * per_unit
        units -= take
    return value


def test_rma_curve_prices_the_first_extras_above_the_mean_and_the_last_below() -> None:
    from streams.control.value_curves import rma_curve

    # a request's value from k extras: 0.05 ln(1 + k/16); requests carried 256 each
    scale, carried, rps, per_unit = 16.0, 256.0, 50.0, 4000.0
    lift = 0.05 * math.log1p(carried / scale)
    curve = rma_curve(lift, math.log1p(carried / scale), scale, 2032.0,
                      units_per_accel_s=per_unit, request_rps=rps)
    values = [v for _, v in curve]
    assert values == sorted(values, reverse=True)
    mean_per_unit = lift / carried * per_unit       # the one linear piece it replaces
    assert values[0] > 4.0 * mean_per_unit and values[-1] < mean_per_unit / 3.0
    for extras in (8.0, 64.0, 256.0, 2032.0):       # the curve's value is the request's
        want = rps * 0.05 * math.log1p(extras / scale)
        assert _curve_value(curve, extras * rps / per_unit) == pytest.approx(want, rel=0.1)
    assert rma_curve(0.0, 1.0, scale, 256.0, units_per_accel_s=per_unit, request_rps=rps) == ()
    assert rma_curve(lift, 0.0, scale, 256.0, units_per_accel_s=per_unit, request_rps=rps) == ()


def test_the_true_split_counts_what_routing_changed() -> None:
    from sim.attribution import add_truth, true_lift

    # one segment: 2 baseline-arm requests with RMA value 0.1 each, 2 powerful ones with gain
    # 0.5 and RMA value 0.3 each: SBM added 0.5 + 0.3 - 0.1 per powerful request
    truth: dict[str, list[float]] = {}
    for powerful, value in ((False, 0.1), (False, 0.1), (True, 0.8), (True, 0.8)):
        add_truth(truth, "s", powerful, value, 2.0)
    lift = true_lift(truth)
    assert lift["all"] == pytest.approx(1.8 / 4)
    assert lift["sbm"] == pytest.approx(2 * 0.7 / 4)
    assert lift["rma"] == pytest.approx((1.8 - 1.4) / 4)
    assert true_lift({}) == {"all": None, "sbm": None, "rma": None, "precompute": None}


def test_the_true_split_weighs_the_arms_as_the_logged_propensities_do() -> None:
    from sim.attribution import add_truth, true_lift

    # while routed at p = 0.9 (extras on), the baseline arm was worth 0.3; during a reclaim
    # every request went baseline (p = 1 for it) with extras cut, worth 0.0. Weighted by
    # inverse propensity the baseline arm is worth (10 x 0.3 + 10 x 0.0) / 20 = 0.15 beside
    # the powerful arm's 0.8, not the 0.03 raw mean of its 11 requests, mostly the reclaim's
    truth: dict[str, list[float]] = {}
    for _ in range(9):
        add_truth(truth, "s", True, 0.8, 1 / 0.9)
    add_truth(truth, "s", False, 0.3, 1 / 0.1)
    for _ in range(10):
        add_truth(truth, "s", False, 0.0, 1.0)
    assert true_lift(truth)["sbm"] == pytest.approx(9 * (0.8 - 0.15) / 20)


def test_a_bad_labels_key_stops_the_start_naming_it(tmp_path: Path) -> None:
    from streams.control.config import ConfigError, load_config

    path = tmp_path / "control.toml"
    path.write_text("[labels]\nwindow_seconds = 60\n")
    with pytest.raises(ConfigError, match="window_seconds"):
        load_config(path)
    path.write_text("[labels]\nmax_pending = 0\n")
    with pytest.raises(ConfigError, match=r"labels.max_pending"):
        load_config(path)
    path.write_text("[labels]\nwindow_s = 120.0\n")
    assert load_config(path).labels.window_s == 120.0


def test_the_lift_compares_treated_and_holdout_over_the_same_requests() -> None:
    """Past max_effective_n the gains forget; the lift must not (a recent treated mean against
    a whole-history holdout mean is off whenever the lift moves)."""
    rng = np.random.default_rng(11)
    est = GainEstimator(SbmConfig(max_effective_n=1000), LabelsConfig())
    true = []
    for i in range(40_000):
        lift = 0.1 if i < 20_000 else 0.3
        if rng.random() < 0.05:
            est.observe(decision(f"h{i}", holdout=True, value=1.0 + rng.normal(0.0, 0.2)))
            continue
        powerful = rng.random() < 0.5
        est.observe(decision(f"t{i}", model="powerful" if powerful else "baseline",
                             propensity=0.5, extra=4,
                             value=1.0 + lift + (0.1 if powerful else 0.0)
                             + rng.normal(0.0, 0.2)))
        true.append(lift + (0.1 if powerful else 0.0))
    e = est.lift()["all"]
    assert e.ci_low is not None and e.ci_high is not None
    assert e.ci_low <= float(np.mean(true)) <= e.ci_high, (e, np.mean(true))
    sbm = est.lift()["sbm"]
    assert sbm.measured == pytest.approx(0.05, abs=0.01)     # half the treated, gain 0.1


def _mixed(est: GainEstimator, holdout_share_a: float, n: int = 4000) -> None:
    """Treated requests half segment ``a`` (worth 0), half ``b`` (worth 1), every one lifted
    by 0.1 (noise sd 0.05); the holdout's mix is ``holdout_share_a`` of ``a``."""
    rng = np.random.default_rng(2)
    for i in range(n):
        seg = "a" if i % 2 else "b"
        est.observe(decision(f"t{i}", segment=seg, value=(seg == "b") + 0.1
                             + rng.normal(0.0, 0.05)))
    for i in range(n // 10):
        seg = "a" if i < holdout_share_a * (n // 10) else "b"
        est.observe(decision(f"h{i}", segment=seg, holdout=True,
                             value=(seg == "b") + rng.normal(0.0, 0.05)))


def test_the_lift_compares_each_segment_with_its_own_holdout() -> None:
    """A holdout whose segment mix is off (by chance, at 1%) does not move the lift: the plain
    difference of means would read 0.1 + 0.3 here."""
    est = GainEstimator(SbmConfig(), LabelsConfig())
    _mixed(est, holdout_share_a=0.8)
    e = est.lift()["all"]
    assert e.measured == pytest.approx(0.1, abs=0.01)
    assert e.ci_low is not None and e.ci_high is not None and e.ci_low <= 0.1 <= e.ci_high
    assert e.ci_high - e.ci_low < 0.03                  # the segments' spread is not noise


def test_a_segment_too_rare_for_a_stratum_of_its_own_is_pooled_not_dropped() -> None:
    est = GainEstimator(SbmConfig(), LabelsConfig(min_labels=30))
    _mixed(est, holdout_share_a=0.5)
    before = est.lift()["all"].measured
    for i in range(10):                                 # treated only: no holdout to match
        est.observe(decision(f"rare{i}", segment="rare", value=5.0))
    e = est.lift()["all"]
    assert before is not None and e.measured is not None and e.std is not None
    # its outcomes count, against the holdout of the stratum it joined (a's, worth about 0)
    assert e.measured == pytest.approx(before * 4000 / 4010 + 10 * 5.0 / 4010, abs=0.001)
    assert est.counts() == {"treated": 4010, "holdout": 400}


def test_a_snapshot_from_before_the_strata_gives_the_plain_difference() -> None:
    est = GainEstimator(SbmConfig(), LabelsConfig())
    _mixed(est, holdout_share_a=0.8)
    old = msgspec.structs.replace(est.state, strata={})
    e = GainEstimator(SbmConfig(), LabelsConfig(), old).lift()["all"]
    assert e.measured == pytest.approx(0.1 + 0.3, abs=0.02)


def _capped_rounds(rng: np.random.Generator, n: int, gain: float,
                   scale: float = 16.0) -> list[RoutingOutcome]:
    """Rounds where a powerful request carries at most 16 extras and a baseline one up to
    256, k extras worth 0.05·ln(1 + k/scale) (16: the demo's curve) on top of the gain."""
    out = []
    for i in range(n):
        powerful = rng.random() < 0.5
        extra = int(rng.integers(0, 17 if powerful else 257))
        value = (1.0 + (gain if powerful else 0.0) + 0.05 * np.log1p(extra / scale)
                 + rng.normal(0.0, 0.05))
        out.append(decision(f"r{i}", model="powerful" if powerful else "baseline",
                            propensity=0.5, extra=extra, value=float(value)))
    return out


def _gain(rounds: list[RoutingOutcome]) -> tuple[float, Any]:
    est = GainEstimator(SbmConfig(), LabelsConfig())
    for r in rounds:
        est.observe(r)
    arms = est.state.segments["s"]
    return arms.powerful.mean - arms.baseline.mean, est.gain("s")


def test_the_gain_is_measured_at_equal_extras_when_the_arms_get_different_extras() -> None:
    covered = 0
    for seed in range(5):
        raw, g = _gain(_capped_rounds(np.random.default_rng(seed), 20_000, 0.02, scale=1.0))
        assert raw < -0.1                               # the raw difference: a loss
        assert g.measured is not None and g.ci_low is not None and g.ci_high is not None
        covered += g.ci_low <= 0.02 <= g.ci_high
    assert covered >= 4, covered


def test_on_a_curve_of_another_scale_the_adjustment_learns_the_scale_and_covers_the_gain(
        ) -> None:
    """On the demo's ln(1 + k/16) a covariate of log1p(extras) removed most of the bias, not
    all of it (0.007 measured for 0.02 on these seeds); the scale chosen by fit covers it."""
    covered = 0
    for seed in range(5):
        est = GainEstimator(SbmConfig(), LabelsConfig())
        for r in _capped_rounds(np.random.default_rng(seed), 20_000, 0.02):
            est.observe(r)
        assert SCALES[est.scale()] == 16.0
        g = est.gain("s")
        assert g.measured is not None and g.ci_low is not None and g.ci_high is not None
        covered += g.ci_low <= 0.02 <= g.ci_high
    assert covered >= 4, covered


def test_a_snapshot_from_before_the_extras_sums_reads_as_no_adjustment() -> None:
    est = GainEstimator(SbmConfig(), LabelsConfig())
    for r in _capped_rounds(np.random.default_rng(0), 2000, gain=0.02):
        est.observe(r)
    old = msgspec.json.decode(msgspec.json.encode(est.state))
    for arms in old["segments"].values():
        for arm in (0, 1):                              # Arms and Moments are arrays
            arms[arm] = arms[arm][:6]                   # Moments as the wire held it before
    state = msgspec.json.decode(msgspec.json.encode(old), type=type(est.state))
    g = GainEstimator(SbmConfig(), LabelsConfig(), state).gain("s")
    arms = state.segments["s"]
    assert g.measured == pytest.approx(arms.powerful.mean - arms.baseline.mean)
