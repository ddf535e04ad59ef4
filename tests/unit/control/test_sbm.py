from __future__ import annotations

import math

import msgspec
import pytest

from streams.control.config import SbmConfig
from streams.control.sbm import SbmPolicy, SbmState, SegmentEstimator, SegmentState
from streams.control.windows import WindowStats
from tests.unit.control.factories import POWERFUL_POOL, outcome

CONFIG = SbmConfig(sla_p99_ms=200.0, max_coverage=0.5, headroom=0.8,
                   powerful_rps_per_accel_unit=25.0, trim_factor=0.5,
                   max_increase_per_period=1.0)


def powerful(capacity_rps: float, p99_ms: float = 100.0, *, enough: bool = True,
             tier: str = "opportunistic") -> WindowStats:
    return WindowStats(pool_id=POWERFUL_POOL, region="eu1", model="powerful", tier=tier,
                       accelerator="a100", start_ms=0, end_ms=10_000, reports=10,
                       samples=500 if enough else 2, p50_ms=p99_ms / 2, p99_ms=p99_ms,
                       request_rate=10.0, baseline_rate=10.0, optional_done_rate=0.0,
                       shed_rate=0.0, utilisation=0.5, capacity_rps=capacity_rps,
                       enough_samples=enough)


def test_coverage_is_headroom_times_serviceable_share() -> None:
    policy = SbmPolicy(CONFIG)
    # measured 100 rps, allocation pays for 4 * 25 = 100 rps, 1000 rps of traffic
    assert policy.step([powerful(100.0)], 4.0, 1000.0, 25.0) == pytest.approx(0.08)


def test_allocation_limits_measured_capacity() -> None:
    policy = SbmPolicy(CONFIG)
    assert policy.step([powerful(400.0)], 2.0, 1000.0, 25.0,
                       allocation_limit="budget") == pytest.approx(0.8 * 50 / 1000)


def test_holding_every_unit_it_can_run_on_sbm_reads_the_replicas_measured_capacity() -> None:
    policy = SbmPolicy(CONFIG)
    assert policy.step([powerful(40.0)], 2.0, 1000.0, 25.0,
                       allocation_limit="capacity") == pytest.approx(0.8 * 40 / 1000)


def test_coverage_never_exceeds_max() -> None:
    policy = SbmPolicy(CONFIG)
    assert policy.step([powerful(10_000.0)], 1000.0, 100.0, 25.0) == 0.5


def test_zero_without_powerful_capacity() -> None:
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.3))
    assert policy.step([powerful(100.0)], 0.0, 1000.0, 25.0) == 0.0
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.3))
    assert policy.step([], 4.0, 1000.0, 25.0) == 0.0
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.3))
    assert policy.step([powerful(100.0, tier="baseline")], 4.0, 1000.0, 25.0) == 0.0


def test_trimmed_multiplicatively_while_powerful_p99_exceeds_its_sla() -> None:
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.08))
    assert policy.step([powerful(100.0, p99_ms=250.0)], 4.0, 1000.0, 25.0) == pytest.approx(0.04)
    assert policy.step([powerful(100.0, p99_ms=250.0)], 4.0, 1000.0, 25.0) == pytest.approx(0.02)
    assert policy.step([powerful(100.0, p99_ms=150.0)], 4.0, 1000.0, 25.0) == pytest.approx(0.08)


def test_rises_at_most_max_increase_per_period() -> None:
    # a floor of 0 learnt: a p99 of 100 is queueing, over 0.4 of the way to the SLA of 200
    policy = SbmPolicy(msgspec.structs.replace(CONFIG, max_increase_per_period=0.02),
                       SbmState(floor_ms=0.0))
    steps = [policy.step([powerful(1000.0)], 40.0, 1000.0, 25.0) for _ in range(3)]
    assert steps == pytest.approx([0.02, 0.04, 0.06])


def test_far_under_the_sla_coverage_doubles_up_to_what_capacity_supports() -> None:
    policy = SbmPolicy(msgspec.structs.replace(CONFIG, max_increase_per_period=0.02))
    steps = [policy.step([powerful(1000.0, p99_ms=60.0)], 40.0, 1000.0, 25.0)
             for _ in range(6)]
    assert steps == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.32, 0.5])
    capped = SbmPolicy(msgspec.structs.replace(CONFIG, max_increase_per_period=0.02),
                       SbmState(coverage=0.05))
    assert capped.step([powerful(100.0, p99_ms=60.0)], 4.0, 1000.0, 25.0) == pytest.approx(0.08)
    assert capped.limited_by == "capacity"


def test_slow_start_is_judged_from_the_latency_floor_not_from_zero() -> None:
    # The model's own p99 is 120 ms of a 200 ms SLA at any coverage: over half the SLA, but
    # no queueing yet, so coverage doubles until the p99 leaves the floor by 0.4 of the way.
    policy = SbmPolicy(msgspec.structs.replace(CONFIG, max_increase_per_period=0.02,
                                               max_coverage=1.0))
    p99s = [120.0, 125.0, 150.0, 155.0, 130.0]
    steps = [policy.step([powerful(1000.0, p99_ms=p99)], 40.0, 1000.0, 25.0) for p99 in p99s]
    assert policy.slow_start_ms() == pytest.approx(120.0 + 0.4 * (200.0 - 120.0))
    assert steps == pytest.approx([0.02, 0.04, 0.08, 0.10, 0.20])


def test_the_latency_floor_only_falls_and_survives_a_restart() -> None:
    policy = SbmPolicy(CONFIG)
    for p99 in (90.0, 60.0, 150.0):
        policy.step([powerful(1000.0, p99_ms=p99)], 40.0, 1000.0, 25.0)
    assert policy.floor_ms == 60.0
    assert SbmPolicy(CONFIG, policy.state).floor_ms == 60.0
    assert SbmPolicy(CONFIG, msgspec.convert({"coverage": 0.3}, SbmState)).floor_ms is None


def test_slow_start_off_climbs_one_step_at_a_time() -> None:
    policy = SbmPolicy(msgspec.structs.replace(CONFIG, max_increase_per_period=0.02,
                                               slow_start_below=0.0))
    steps = [policy.step([powerful(1000.0, p99_ms=10.0)], 40.0, 1000.0, 25.0) for _ in range(3)]
    assert steps == pytest.approx([0.02, 0.04, 0.06])


def test_a_cap_from_the_allocation_reports_why_the_allocator_gave_no_more() -> None:
    slow = msgspec.structs.replace(CONFIG, max_increase_per_period=0.02)
    # measured 400 rps but 2 units pay for 50: the allocation binds, with the allocator's reason
    by_split = SbmPolicy(slow, SbmState(coverage=0.05))
    by_split.step([powerful(400.0, p99_ms=60.0)], 2.0, 1000.0, 25.0, allocation_limit="demand")
    assert by_split.coverage == pytest.approx(0.04) and by_split.limited_by == "demand"
    no_units = SbmPolicy(slow, SbmState(coverage=0.05))
    assert no_units.step([powerful(400.0)], 0.0, 1000.0, 25.0, allocation_limit="budget") == 0.0
    assert no_units.limited_by == "budget"
    # the replicas' measured 40 rps bind before the 100 the units pay for: the pool is full
    by_pool = SbmPolicy(slow, SbmState(coverage=0.05))
    by_pool.step([powerful(40.0, p99_ms=60.0)], 4.0, 1000.0, 25.0, allocation_limit="demand")
    assert by_pool.coverage == pytest.approx(0.032) and by_pool.limited_by == "capacity"


def test_holds_without_enough_samples_but_still_respects_capacity() -> None:
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.05))
    assert policy.step([powerful(1000.0, enough=False)], 40.0, 1000.0, 25.0) == 0.05
    assert policy.step([powerful(25.0, enough=False)], 1.0, 1000.0, 25.0) == pytest.approx(0.02)


def test_zero_coverage_probes_one_step_since_an_idle_pool_reports_no_latency() -> None:
    policy = SbmPolicy(msgspec.structs.replace(CONFIG, max_increase_per_period=0.02))
    assert policy.step([powerful(1000.0, enough=False)], 40.0, 1000.0, 25.0) == pytest.approx(0.02)
    assert policy.step([powerful(1000.0, enough=False)], 40.0, 1000.0, 25.0) == pytest.approx(0.02)


def test_unknown_traffic_never_raises_coverage() -> None:
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.05))
    assert policy.step([powerful(1000.0)], 40.0, 0.0, 25.0) == 0.05


def test_clamp_only_lowers() -> None:
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.05))
    assert policy.clamp(10_000.0, 100.0) == 0.05
    assert policy.clamp(25.0, 1000.0) == pytest.approx(0.02)
    assert policy.clamp(0.0, 1000.0) == 0.0


def feed(est: SegmentEstimator, segment: str, model: str, values: list[float]) -> None:
    for v in values:
        est.observe(outcome(segment, model, v))


def test_segment_gain_is_powerful_minus_baseline_and_tightens_with_data() -> None:
    est = SegmentEstimator(CONFIG)
    feed(est, "new-users", "baseline", [1.0, 1.2, 0.8] * 4)
    feed(est, "new-users", "powerful", [1.5, 1.7, 1.3] * 4)
    early = est.priority("new-users")
    feed(est, "new-users", "baseline", [1.0, 1.2, 0.8] * 100)
    feed(est, "new-users", "powerful", [1.5, 1.7, 1.3] * 100)
    late = est.priority("new-users")
    assert late.gain_mean == pytest.approx(0.5, abs=0.01)
    assert late.gain_std < early.gain_std
    assert late.observations == 624


def test_segments_are_ranked_by_their_own_gain() -> None:
    est = SegmentEstimator(CONFIG)
    feed(est, "a", "baseline", [1.0] * 50)
    feed(est, "a", "powerful", [2.0] * 50)
    feed(est, "b", "baseline", [1.0] * 50)
    feed(est, "b", "powerful", [1.1] * 50)
    prio = est.priorities()
    assert list(prio) == ["a", "b"]
    assert prio["a"].gain_mean > prio["b"].gain_mean > 0


def test_one_sided_segment_is_compared_with_fleet_value_not_zero() -> None:
    est = SegmentEstimator(CONFIG)
    feed(est, "a", "baseline", [5.0] * 200)
    feed(est, "b", "powerful", [5.2] * 200)
    assert est.priority("b").gain_mean == pytest.approx(0.2, abs=0.05)


def test_segment_count_is_bounded_by_evicting_the_least_observed() -> None:
    est = SegmentEstimator(msgspec.structs.replace(CONFIG, max_segments=2))
    feed(est, "big", "baseline", [1.0] * 5)
    feed(est, "small", "baseline", [1.0])
    feed(est, "new", "baseline", [1.0])
    assert set(est.priorities()) == {"big", "new"}


def test_estimator_state_round_trips() -> None:
    est = SegmentEstimator(CONFIG)
    feed(est, "a", "baseline", [0.3, 0.9, 0.1])
    feed(est, "a", "powerful", [0.7])
    feed(est, "b", "powerful", [0.2, 0.4])
    state = msgspec.json.decode(msgspec.json.encode(est.state), type=SegmentState)
    again = SegmentEstimator(CONFIG, state)
    assert again.priorities() == est.priorities()
    feed(est, "a", "powerful", [0.5])
    feed(again, "a", "powerful", [0.5])
    assert again.state == est.state


def test_a_coverage_too_small_to_gather_samples_steps_up_unless_a_sample_was_slow() -> None:
    policy = SbmPolicy(msgspec.structs.replace(CONFIG, max_increase_per_period=0.02),
                       SbmState(coverage=0.02))
    assert policy.step([powerful(1000.0, enough=False)], 40.0, 1000.0, 25.0,
                       starved=True) == pytest.approx(0.04)
    assert policy.step([powerful(1000.0, p99_ms=300.0, enough=False)], 40.0, 1000.0, 25.0,
                       starved=True) == pytest.approx(0.04)
    assert policy.limited_by == "hold"


def test_coverage_cut_by_a_reclaim_returns_in_one_step_when_capacity_does() -> None:
    slow = msgspec.structs.replace(CONFIG, max_increase_per_period=0.01, slow_start_below=0.0)
    policy = SbmPolicy(slow, SbmState(coverage=0.4))
    assert policy.clamp(0.0, 100.0) == 0.0
    state = msgspec.json.decode(msgspec.json.encode(policy.state), type=SbmState)
    assert SbmPolicy(slow, state).step([powerful(1000.0)], 40.0, 100.0, 25.0) == 0.4


def test_a_powerful_pool_over_its_sla_trims_the_held_coverage_as_it_trims_coverage() -> None:
    slow = msgspec.structs.replace(CONFIG, max_increase_per_period=0.01, slow_start_below=0.0)
    policy = SbmPolicy(slow, SbmState(coverage=0.4))
    policy.clamp(10.0, 100.0)                                      # 0.08 left, 0.4 held
    policy.step([powerful(10.0, p99_ms=300.0)], 40.0, 100.0, 25.0)  # over the SLA: trimmed
    assert policy.coverage == pytest.approx(0.04)
    assert policy.step([powerful(1000.0)], 40.0, 100.0, 25.0) == pytest.approx(0.2)  # 0.4 x 0.5


def test_a_powerful_pool_over_its_sla_with_nothing_held_has_nothing_to_return_to() -> None:
    slow = msgspec.structs.replace(CONFIG, max_increase_per_period=0.01, slow_start_below=0.0)
    policy = SbmPolicy(slow, SbmState(coverage=0.4))
    policy.step([powerful(1000.0, p99_ms=300.0)], 40.0, 100.0, 25.0)  # trimmed to 0.2
    assert policy.step([powerful(1000.0)], 40.0, 100.0, 25.0) == pytest.approx(0.21)


def test_over_its_sla_the_powerful_pool_sheds_its_requests_extras_before_coverage() -> None:
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.08))
    slow = [powerful(100.0, p99_ms=250.0)]
    assert policy.step(slow, 4.0, 1000.0, 25.0, rma_extra=40) == pytest.approx(0.08)
    assert policy.extra_cap == 20                                  # 40 x trim 0.5
    assert policy.step(slow, 4.0, 1000.0, 25.0, rma_extra=40) == pytest.approx(0.08)
    assert policy.extra_cap == 10
    assert policy.limited_by == "sla"
    assert policy.target(SegmentEstimator(CONFIG)).extra_candidates == 10


def test_coverage_is_trimmed_once_powerful_requests_carry_no_extras() -> None:
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.08, extra_cap=1))
    slow = [powerful(100.0, p99_ms=250.0)]
    assert policy.step(slow, 4.0, 1000.0, 25.0, rma_extra=40) == pytest.approx(0.08)
    assert policy.extra_cap == 0
    assert policy.step(slow, 4.0, 1000.0, 25.0, rma_extra=40) == pytest.approx(0.04)
    without_extras = SbmPolicy(CONFIG, SbmState(coverage=0.08))
    assert without_extras.step(slow, 4.0, 1000.0, 25.0, rma_extra=0) == pytest.approx(0.04)
    assert without_extras.extra_cap is None


def test_under_the_sla_the_cap_on_extras_regrows_and_is_lifted_at_rmas_target() -> None:
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.08, extra_cap=0))
    fast = [powerful(10_000.0, p99_ms=150.0)]        # capacity to cover all it may
    caps = []
    for _ in range(12):
        policy.step(fast, 400.0, 1000.0, 25.0, rma_extra=10)
        caps.append(policy.extra_cap)
    assert caps[:6] == [1, 2, 3, 4, 5, 7]                          # +1, then x1.25
    assert caps[-1] is None
    assert SbmPolicy(CONFIG, policy.state).extra_cap is None


def test_with_room_on_the_powerful_replicas_their_requests_extras_take_half_of_it() -> None:
    roomy = msgspec.structs.replace(powerful(10_000.0, p99_ms=150.0), units_rate=300.0,
                                    utilisation=0.4)
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.5, extra_cap=2))
    policy.step([roomy], 1000.0, 100.0, 25.0, rma_extra=40)
    spare = 300.0 * (CONFIG.headroom / 0.4 - 1.0)                # units/s up to the headroom
    assert policy.extra_cap == math.floor(2 + 0.5 * spare / 10.0)
    busy = msgspec.structs.replace(roomy, utilisation=0.95)
    policy.step([busy], 1000.0, 100.0, 25.0, rma_extra=40)
    assert policy.extra_cap is not None and policy.extra_cap < math.floor(2 + 0.5 * spare / 10)


def test_the_cap_on_extras_is_never_above_rmas_own_target() -> None:
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.08, extra_cap=30))
    policy.step([powerful(100.0, p99_ms=250.0)], 4.0, 1000.0, 25.0, rma_extra=8)
    assert policy.extra_cap == 4
    state = msgspec.json.decode(msgspec.json.encode(policy.state), type=SbmState)
    assert state.extra_cap == 4


def test_coverage_of_every_request_is_limited_by_demand_a_lower_maximum_by_max() -> None:
    everyone = SbmPolicy(msgspec.structs.replace(CONFIG, max_coverage=1.0),
                         SbmState(coverage=1.0))
    everyone.step([powerful(10_000.0)], 1000.0, 100.0, 25.0)
    assert (everyone.coverage, everyone.limited_by) == (1.0, "demand")
    half = SbmPolicy(CONFIG, SbmState(coverage=0.5))
    half.step([powerful(10_000.0)], 1000.0, 100.0, 25.0)
    assert (half.coverage, half.limited_by) == (0.5, "max")


def test_every_request_covered_with_its_extras_held_is_limited_by_the_replicas() -> None:
    # coverage is full, but a covered request keeps only 40 of the 100 extras RMA allows:
    # the powerful replicas bind, not the traffic; a period over the SLA says so
    config = msgspec.structs.replace(CONFIG, max_coverage=1.0)
    held = SbmPolicy(config, SbmState(coverage=1.0, extra_cap=40))
    held.step([powerful(10_000.0, p99_ms=50.0)], 1000.0, 100.0, 25.0, rma_extra=100)
    assert (held.coverage, held.limited_by) == (1.0, "capacity")
    over = SbmPolicy(config, SbmState(coverage=1.0, extra_cap=40))
    over.step([powerful(10_000.0, p99_ms=400.0)], 1000.0, 100.0, 25.0, rma_extra=100)
    assert (over.coverage, over.limited_by) == (1.0, "sla") and over.extra_cap == 20
    unheld = SbmPolicy(config, SbmState(coverage=1.0, extra_cap=40))
    unheld.step([powerful(10_000.0, p99_ms=50.0)], 1000.0, 100.0, 25.0, rma_extra=30)
    assert (unheld.coverage, unheld.limited_by) == (1.0, "demand")


def test_extras_the_powerful_replicas_trim_hold_the_cap_to_what_they_kept() -> None:
    # 10 requests/s carried 40 extras each; the replicas shed 300 units/s for overload (30 a
    # request): the room in units/s says more, but one request's queue bound fits 10
    trimming = msgspec.structs.replace(powerful(10_000.0, p99_ms=150.0), units_rate=300.0,
                                       utilisation=0.4, overload_shed_rate=300.0)
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.5))
    policy.step([trimming], 1000.0, 100.0, 25.0, rma_extra=40)
    assert policy.extra_cap == 10
    # a trim within the tolerance leaves the room rule in charge again
    slight = msgspec.structs.replace(trimming, overload_shed_rate=1.0)
    policy.step([slight], 1000.0, 100.0, 25.0, rma_extra=40)
    assert policy.extra_cap is not None and policy.extra_cap > 10


def test_a_covered_requests_extras_are_held_to_what_one_could_keep_on_a_powerful_replica() -> None:
    # the replicas' room in units/s would let each request carry far more, but one request's
    # queue bound fits 12 extras at best: past that every request is trimmed
    roomy = msgspec.structs.replace(powerful(10_000.0, p99_ms=150.0), units_rate=300.0,
                                    utilisation=0.4, extras_room=12)
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.5))
    policy.step([roomy], 1000.0, 100.0, 25.0, rma_extra=40)
    assert policy.extra_cap == 12
    # room for more than RMA's own target: no cap of SBM's own
    wide = msgspec.structs.replace(roomy, extras_room=500)
    policy = SbmPolicy(CONFIG, SbmState(coverage=0.5))
    policy.step([wide], 1000.0, 100.0, 25.0, rma_extra=40)
    assert policy.extra_cap is None
