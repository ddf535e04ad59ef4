"""SBM routing meets coverage on average, best segments first, with bounded exploration."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tests.unit.policy.helpers import T0, targets
from workers.policy.routing import OTHER_SEGMENT, RouterConfig, SbmRouter
from workers.policy.targets import EffectiveTargets, LocalLimits, TargetState


def _eff(coverage: float, segments: dict[str, tuple[float, float]] | None = None,
         epoch: int = 1) -> EffectiveTargets:
    state = TargetState("eu1", LocalLimits())
    assert state.offer(targets(coverage=coverage, segments=segments, epoch=epoch), T0).accepted
    return state.current(T0)


def _run(router: SbmRouter, eff: EffectiveTargets, shares: dict[str, float], n: int,
         seed: int = 7, allowance: float = 1.0) -> Counter[tuple[str, str]]:
    """Route `n` requests drawn from `shares`; count (segment, outcome)."""
    rng = np.random.default_rng(seed)
    names = list(shares)
    picks = rng.choice(len(names), size=n, p=list(shares.values()))
    counts: Counter[tuple[str, str]] = Counter()
    for i in picks.tolist():
        d = router.route(names[i], eff, allowance)
        outcome = "shed" if d.shed else ("explored" if d.explored else d.model)
        counts[(names[i], outcome)] += 1
    return counts


def _total(counts: Counter[tuple[str, str]], *outcomes: str) -> int:
    return sum(c for (_, o), c in counts.items() if o in outcomes)


SHARES = {"a": 0.4, "b": 0.3, "c": 0.2, "d": 0.1}
GAINS = {"a": (0.01, 0.001), "b": (0.03, 0.001), "c": (0.05, 0.001), "d": (0.02, 0.001)}


@pytest.mark.parametrize("coverage", [0.05, 0.25, 0.6, 1.0])
def test_powerful_share_meets_coverage_on_average(coverage: float) -> None:
    router = SbmRouter(RouterConfig(), seed=1)
    counts = _run(router, _eff(coverage, GAINS), SHARES, 100_000)
    share = _total(counts, "powerful", "explored") / 100_000
    # full coverage leaves every segment its baseline floor (2%)
    assert share == pytest.approx(min(coverage, 0.98), abs=0.01)


def test_every_segment_keeps_its_baseline_floor_so_no_logged_weight_exceeds_its_inverse() -> None:
    router = SbmRouter(RouterConfig(baseline_floor=0.05), seed=3)
    eff = _eff(1.0, GAINS)
    counts = _run(router, eff, SHARES, 40_000)
    for seg, share in SHARES.items():
        on_baseline = counts[(seg, "baseline")] / (40_000 * share)
        assert on_baseline == pytest.approx(0.05, abs=0.01), seg
    for seg in [*SHARES, "never-seen"]:
        router.route(seg, eff)
        assert 1.0 - router.last_p >= 0.05 - 1e-12, seg


def test_zero_coverage_or_baseline_only_always_routes_baseline() -> None:
    router = SbmRouter(RouterConfig(), seed=1)
    state = TargetState("eu1", LocalLimits())
    counts = _run(router, state.current(T0), SHARES, 2_000)
    counts += _run(router, _eff(0.0, GAINS), SHARES, 2_000)
    state.offer(targets(coverage=0.9), T0)
    state.preempt(T0 + 1)
    counts += _run(router, state.current(T0 + 2), SHARES, 2_000)
    assert _total(counts, "baseline") == 6_000


def test_highest_gain_segments_are_filled_first() -> None:
    # c (0.05) then b (0.03): coverage 0.4 * 0.95 fills c (0.2) and 0.18 of b's 0.3.
    router = SbmRouter(RouterConfig(), seed=3)
    counts = _run(router, _eff(0.4, GAINS), SHARES, 100_000)
    rate = {s: counts[(s, "powerful")] / sum(c for (t, _), c in counts.items() if t == s)
            for s in SHARES}
    assert rate["c"] > 0.97
    assert rate["b"] == pytest.approx(0.18 / 0.3, abs=0.05)
    assert rate["a"] < 0.02 and rate["d"] < 0.02


def test_exploration_is_bounded_and_goes_to_segments_not_chosen() -> None:
    router = SbmRouter(RouterConfig(explore_rate=0.05), seed=5)
    counts = _run(router, _eff(0.3, GAINS), SHARES, 200_000)
    powerful = _total(counts, "powerful", "explored")
    explored = _total(counts, "explored")
    assert explored / powerful == pytest.approx(0.05, abs=0.01)
    # c is chosen in full (0.2 of 0.285): nothing of it is left to explore, once shares settle.
    assert counts[("c", "explored")] < 0.001 * counts[("c", "powerful")]
    assert {s for (s, o) in counts if o == "explored"} == {"a", "b", "d"}


def test_exploration_rate_is_configurable_down_to_zero() -> None:
    router = SbmRouter(RouterConfig(explore_rate=0.0), seed=5)
    counts = _run(router, _eff(0.2, GAINS), SHARES, 20_000)
    assert _total(counts, "explored") == 0


def test_same_seed_gives_same_decisions_and_another_seed_does_not() -> None:
    def decisions(seed: int) -> list[tuple[str, bool]]:
        router = SbmRouter(RouterConfig(), seed=seed)
        eff = _eff(0.3, {"a": (0.0, 1.0), "b": (0.0, 1.0)})
        return [(d.model, d.explored) for d in
                (router.route("ab"[i % 2], eff) for i in range(5_000))]

    assert decisions(11) == decisions(11)
    assert decisions(11) != decisions(12)


def test_new_targets_take_effect_on_the_next_request() -> None:
    router = SbmRouter(RouterConfig(recompute_every=1_000_000), seed=1)
    _run(router, _eff(0.1, GAINS), SHARES, 5_000)
    counts = _run(router, _eff(0.9, GAINS, epoch=2), SHARES, 5_000)
    assert _total(counts, "powerful", "explored") / 5_000 == pytest.approx(0.9, abs=0.03)


def test_allowance_cut_drops_lowest_gain_traffic_first_and_counts_it_shed() -> None:
    router = SbmRouter(RouterConfig(explore_rate=0.0), seed=2)
    eff = _eff(0.5, GAINS)
    _run(router, eff, SHARES, 5_000)
    counts = _run(router, eff, SHARES, 50_000, allowance=0.5)
    assert _total(counts, "powerful") / 50_000 == pytest.approx(0.25, abs=0.01)
    assert _total(counts, "shed") / 50_000 == pytest.approx(0.25, abs=0.01)
    assert counts[("c", "shed")] == 0   # the best segment keeps all its coverage
    assert counts[("b", "shed")] > 0


def test_own_observations_reorder_segments_the_control_plane_cannot_tell_apart() -> None:
    router = SbmRouter(RouterConfig(explore_rate=0.0, recompute_every=256,
                                    min_observations=10), seed=4)
    eff = _eff(0.5, {"x": (0.0, 1.0), "y": (0.0, 1.0)})
    _run(router, eff, {"x": 0.5, "y": 0.5}, 2_000)   # the segments enter the traffic shares
    rng = np.random.default_rng(0)
    for _ in range(200):
        router.observe("x", "baseline", float(rng.normal(1.0, 0.1)))
        router.observe("x", "powerful", float(rng.normal(1.1, 0.1)))
        router.observe("y", "baseline", float(rng.normal(1.0, 0.1)))
        router.observe("y", "powerful", float(rng.normal(1.5, 0.1)))
    counts = _run(router, eff, {"x": 0.5, "y": 0.5}, 20_000)
    assert counts[("y", "powerful")] > 0.95 * (counts[("y", "powerful")]
                                               + counts[("y", "baseline")])
    assert counts[("x", "powerful")] < 0.05 * (counts[("x", "powerful")]
                                               + counts[("x", "baseline")])


def test_segment_count_is_bounded() -> None:
    router = SbmRouter(RouterConfig(max_segments=3), seed=1)
    eff = _eff(0.5)
    for i in range(100):
        router.route(f"s{i}", eff)
    assert set(router.shares()) == {"s0", "s1", "s2", OTHER_SEGMENT}
    assert router.shares()[OTHER_SEGMENT] == pytest.approx(0.97, abs=0.005)


def test_traffic_shares_follow_a_shift_in_the_mix() -> None:
    router = SbmRouter(RouterConfig(half_life_requests=2_000, recompute_every=500), seed=1)
    eff = _eff(0.5)
    _run(router, eff, {"a": 0.9, "b": 0.1}, 20_000)
    _run(router, eff, {"a": 0.1, "b": 0.9}, 20_000)
    assert router.shares()["b"] > 0.8
