from __future__ import annotations

import itertools
import math

import msgspec
import pytest

from streams.control.allocator import Allocation
from streams.control.config import RmaConfig
from streams.control.rma import (
    CandidateSupply,
    RmaPolicy,
    RmaState,
    provisioned_headroom,
    rma_budget,
)
from streams.control.windows import WindowStats
from tests.unit.control.factories import RANK_BASE_POOL, RANK_POOL

CONFIG = RmaConfig(sla_p99_ms=100.0, margin=0.8, kp=0.1, ki=0.05, max_extra_candidates=200,
                   max_step=10.0, max_step_down=50.0, overload_cut=0.5)
BIG_BUDGET = 1e9


def stats(p99_ms: float, *, pool: str = RANK_POOL, rate: float = 100.0, enough: bool = True,
          model: str = "baseline") -> WindowStats:
    return WindowStats(pool_id=pool, region="eu1", model=model, tier="opportunistic",
                       accelerator="a100", start_ms=0, end_ms=10_000, reports=10,
                       samples=1000 if enough else 3, p50_ms=p99_ms / 2, p99_ms=p99_ms,
                       request_rate=rate, baseline_rate=rate, optional_done_rate=0.0,
                       shed_rate=0.0, utilisation=0.5, capacity_rps=0.0, enough_samples=enough)


def test_raises_extra_candidates_while_latency_is_low() -> None:
    policy = RmaPolicy(CONFIG)
    extras = [policy.step([stats(60.0)], BIG_BUDGET, 10.0).extra_candidates for _ in range(5)]
    assert extras == sorted(extras) and extras[-1] > 0
    assert all(b - a <= 10 for a, b in itertools.pairwise(extras))   # max step


def test_far_under_the_sla_extras_double_up_to_the_budget() -> None:
    policy = RmaPolicy(CONFIG)
    budget = 120.0 * 100.0                                      # 120 per request at 100 rps
    extras = [policy.step([stats(30.0)], budget, 10.0).extra_candidates for _ in range(6)]
    assert extras == [10, 20, 40, 80, 120, 120]
    assert policy.limited_by == "budget"
    # then near the SLA the PID's own step rules apply again, from where it got to
    near = policy.step([stats(70.0)], BIG_BUDGET, 10.0).extra_candidates
    assert 120 <= near <= 130


def test_once_the_tail_reached_the_aim_slow_start_stops_at_half_that_output() -> None:
    policy = RmaPolicy(CONFIG)
    climb = [policy.step([stats(30.0)], BIG_BUDGET, 10.0).extra_candidates for _ in range(4)]
    assert climb == [10, 20, 40, 80]
    cut = policy.step([stats(90.0)], BIG_BUDGET, 10.0).extra_candidates   # past the 80 ms aim
    assert cut < 80 and policy.state.threshold == pytest.approx(40.0)
    after = [policy.step([stats(30.0)], BIG_BUDGET, 10.0).extra_candidates for _ in range(3)]
    assert all(b - a <= 10 for a, b in itertools.pairwise([cut, *after]))  # the PID's step


def test_a_reclaim_lets_slow_start_double_again() -> None:
    policy = RmaPolicy(CONFIG)
    for p99 in (30.0, 30.0, 30.0, 30.0, 90.0):
        policy.step([stats(p99)], BIG_BUDGET, 10.0)
    policy.clamp(1_000.0, 100.0)                                 # a notice: 10 per request
    assert policy.state.threshold is None
    again = [policy.step([stats(30.0)], BIG_BUDGET, 10.0).extra_candidates for _ in range(2)]
    assert again == [69, 138]           # back to the held point, then doubling past 40 again


def test_slow_start_off_keeps_the_pid_step() -> None:
    policy = RmaPolicy(msgspec.structs.replace(CONFIG, slow_start_below=0.0))
    extras = [policy.step([stats(30.0)], BIG_BUDGET, 10.0).extra_candidates for _ in range(4)]
    assert extras == [10, 20, 30, 40]


def test_cuts_extra_candidates_when_p99_exceeds_setpoint() -> None:
    policy = RmaPolicy(CONFIG)
    for _ in range(10):
        policy.step([stats(40.0)], BIG_BUDGET, 10.0)
    high = policy.pid.output
    cut = policy.step([stats(95.0)], BIG_BUDGET, 10.0)     # above 80 setpoint, below SLA
    assert cut.extra_candidates < high


def test_breaching_the_sla_itself_cuts_at_once() -> None:
    policy = RmaPolicy(CONFIG)
    for _ in range(10):
        policy.step([stats(40.0)], BIG_BUDGET, 10.0)
    high = policy.pid.output
    target = policy.step([stats(150.0)], BIG_BUDGET, 10.0)
    assert target.extra_candidates <= high * CONFIG.overload_cut


def test_worst_pool_with_enough_samples_is_the_measurement() -> None:
    policy = RmaPolicy(CONFIG)
    policy.step([stats(30.0), stats(90.0, pool=RANK_BASE_POOL),
                 stats(500.0, pool="eu1/rank/baseline/t4/opportunistic", enough=False),
                 stats(900.0, pool="eu1/rank/powerful/a100/opportunistic", model="powerful")],
                BIG_BUDGET, 10.0)
    assert policy.last_p99_ms == 90.0


def test_window_without_enough_samples_holds_output_and_state() -> None:
    policy = RmaPolicy(CONFIG)
    for _ in range(3):
        policy.step([stats(40.0)], BIG_BUDGET, 10.0)
    before = (policy.pid.state, policy.pid.output)
    target = policy.step([stats(1.0, enough=False)], BIG_BUDGET, 10.0)
    assert (policy.pid.state, policy.pid.output) == before
    assert target.extra_candidates == int(before[1])


def test_starved_of_ranking_samples_the_output_steps_up_from_zero() -> None:
    """SBM covers nearly every request: the ranking pools see too few to judge, and holding
    at zero would hold the powerful requests' extras at zero for ever."""
    policy = RmaPolicy(CONFIG)
    thin = [stats(40.0, enough=False, rate=0.5)]
    outputs = [policy.step(thin, BIG_BUDGET, 10.0, starved=True).extra_candidates
               for _ in range(3)]
    assert outputs == [10, 20, 30]                                    # max_step a period
    assert policy.limited_by == "sla"
    assert policy.step(thin, BIG_BUDGET, 10.0).extra_candidates == 30      # not starved: held


def test_starved_but_a_few_samples_over_the_sla_hold_the_output() -> None:
    policy = RmaPolicy(CONFIG)
    policy.step([stats(40.0, enough=False, rate=0.5)], BIG_BUDGET, 10.0, starved=True)
    slow = policy.step([stats(150.0, enough=False, rate=0.5)], BIG_BUDGET, 10.0, starved=True)
    assert slow.extra_candidates == 10 and policy.limited_by == "hold"


def test_budget_caps_extra_work_per_request() -> None:
    policy = RmaPolicy(CONFIG)
    for _ in range(30):
        target = policy.step([stats(10.0, rate=400.0)], 2000.0, 10.0)
    assert target.extra_candidates == 5                      # 5 * 400 rps <= 2000/s
    assert target.extra_candidates * 400.0 <= target.budget_units_per_s
    assert policy.pid.state.integral <= 5.0                  # no windup behind the cap


def test_the_budget_issued_is_what_the_target_spends_at_the_settled_rate() -> None:
    """A burst shares the budget (the clients' buckets) rather than each request taking the
    whole target: the extra work stays level while the arrivals swing."""
    policy = RmaPolicy(CONFIG)
    for _ in range(30):
        steady = policy.step([stats(10.0, rate=100.0)], BIG_BUDGET, 10.0)
    assert steady.extra_candidates == 200 and steady.budget_units_per_s == 200 * 100.0
    burst = policy.step([stats(10.0, rate=300.0)], BIG_BUDGET, 10.0)
    assert burst.extra_candidates == 200 and burst.budget_units_per_s == 200 * 100.0
    scarce = policy.step([stats(10.0, rate=100.0)], 5_000.0, 10.0)
    assert scarce.budget_units_per_s == 5_000.0              # never more than the allocator's


def test_a_burst_of_one_period_does_not_cut_the_budget_cap_to_a_sliver() -> None:
    policy = RmaPolicy(CONFIG)
    for _ in range(30):
        steady = policy.step([stats(10.0, rate=100.0)], 10_000.0, 10.0)
    assert steady.extra_candidates == 100                   # 10,000/s over 100 rps
    burst = policy.step([stats(10.0, rate=1500.0)], 10_000.0, 10.0)
    after = policy.step([stats(10.0, rate=100.0)], 10_000.0, 10.0)
    assert burst.extra_candidates == 100 and after.extra_candidates == 100


def test_a_burst_in_the_second_period_of_a_run_does_not_halve_the_budget_cap() -> None:
    policy = RmaPolicy(CONFIG)
    policy.step([stats(10.0, rate=100.0)], 10_000.0, 10.0)
    assert policy.cap(10_000.0, 1500.0) == 100.0             # the lower of 100 and 1500 rps
    assert policy.settled_rate(1500.0) == 100.0


def test_a_lasting_rise_in_traffic_moves_the_cap_within_a_few_periods() -> None:
    policy = RmaPolicy(CONFIG)
    for _ in range(10):
        policy.step([stats(10.0, rate=100.0)], 10_000.0, 10.0)
    caps = [policy.step([stats(10.0, rate=400.0)], 10_000.0, 10.0).extra_candidates
            for _ in range(4)]
    assert caps[0] == 100 and caps[-1] == 25                # 10,000/s over 400 rps


def test_the_recent_rates_survive_a_restart() -> None:
    policy = RmaPolicy(CONFIG)
    for rate in (100.0, 100.0, 100.0):
        policy.step([stats(10.0, rate=rate)], 10_000.0, 10.0)
    state = msgspec.json.decode(msgspec.json.encode(policy.state), type=RmaState)
    assert RmaPolicy(CONFIG, state).settled_rate(1500.0) == 100.0


def provisioned(utilisation: float, units_rate: float, optional_rate: float, *,
                tier: str = "baseline", model: str = "baseline") -> WindowStats:
    return msgspec.structs.replace(
        stats(10.0, pool=RANK_BASE_POOL, model=model), tier=tier, utilisation=utilisation,
        units_rate=units_rate, optional_done_rate=optional_rate)


def test_provisioned_replicas_lend_their_measured_room_to_the_target_utilisation() -> None:
    # 1,000 units/s at 20% busy: 5,000 units/s when busy all the time; at 70% that is 3,500,
    # of which 600 are baseline work.
    room = provisioned_headroom([provisioned(0.2, 1000.0, 400.0)], 0.7)
    assert room == pytest.approx(2900.0)


def test_busy_or_unmeasurable_provisioned_replicas_lend_nothing() -> None:
    assert provisioned_headroom([provisioned(0.9, 1000.0, 0.0)], 0.7) == 0.0
    assert provisioned_headroom([provisioned(0.001, 1.0, 0.0)], 0.7) == 0.0
    lent = provisioned(0.2, 1000.0, 0.0, tier="opportunistic")
    powerful = provisioned(0.2, 1000.0, 0.0, model="powerful")
    assert provisioned_headroom([lent, powerful], 0.7) == 0.0


def test_zero_budget_means_zero_extra_immediately() -> None:
    policy = RmaPolicy(CONFIG)
    for _ in range(20):
        policy.step([stats(10.0)], BIG_BUDGET, 10.0)
    assert policy.pid.output > 100
    target = policy.step([stats(10.0)], 0.0, 10.0)
    assert target.extra_candidates == 0 and target.budget_units_per_s == 0.0
    held = policy.step([stats(10.0, enough=False)], 0.0, 10.0)
    assert held.extra_candidates == 0


def test_budget_follows_the_scarcer_of_cpu_and_accelerators() -> None:
    cfg = RmaConfig(candidates_per_cpu_unit_s=100.0, candidates_per_accel_unit_s=1000.0)
    alloc = Allocation(rma_cpu=8.0, rma_accel={"a100": 2.0, "t4": 1.0})
    assert rma_budget(alloc, cfg, 1000.0) == pytest.approx(800.0)
    alloc = Allocation(rma_cpu=80.0, rma_accel={"a100": 0.5})
    assert rma_budget(alloc, cfg, 1000.0) == pytest.approx(500.0)


def test_restart_ceiling_bounds_the_step() -> None:
    policy = RmaPolicy(CONFIG)
    target = policy.step([stats(10.0)], BIG_BUDGET, 10.0, ceiling=3.0)
    assert target.extra_candidates == 3


def test_every_target_says_what_limits_it() -> None:
    policy = RmaPolicy(CONFIG)
    assert policy.step([stats(10.0, enough=False)], BIG_BUDGET, 10.0).limited_by == "hold"
    assert policy.step([stats(10.0)], BIG_BUDGET, 10.0).limited_by == "sla"  # ramping
    assert policy.step([stats(10.0)], 0.0, 10.0).limited_by == "budget"
    for _ in range(30):
        capped = policy.step([stats(10.0, rate=400.0)], 2000.0, 10.0)
    assert (capped.extra_candidates, capped.limited_by) == (5, "budget")
    for _ in range(60):
        top = policy.step([stats(10.0)], BIG_BUDGET, 10.0)
    assert (top.extra_candidates, top.limited_by) == (200, "max")
    assert policy.step([stats(150.0)], BIG_BUDGET, 10.0).limited_by == "sla"
    assert policy.clamp(BIG_BUDGET, 100.0).limited_by == "preemption"


def test_a_budget_cut_is_held_and_undone_in_one_step_once_the_budget_is_back() -> None:
    policy = RmaPolicy(msgspec.structs.replace(CONFIG, slow_start_below=0.0))
    for _ in range(30):
        policy.step([stats(60.0)], BIG_BUDGET, 10.0)
    reached = policy.pid.output
    assert policy.clamp(0.0, 100.0).extra_candidates == 0          # capacity reclaimed
    state = msgspec.json.decode(msgspec.json.encode(policy.state), type=RmaState)
    restarted = RmaPolicy(policy.config, state)                    # the hold survives a restart
    back = restarted.step([stats(60.0)], BIG_BUDGET, 10.0).extra_candidates
    assert back == math.floor(reached + 1e-9)


def test_a_held_point_is_forgotten_once_the_tail_reaches_the_aim() -> None:
    policy = RmaPolicy(msgspec.structs.replace(CONFIG, slow_start_below=0.0))
    for _ in range(30):
        policy.step([stats(60.0)], BIG_BUDGET, 10.0)
    policy.clamp(0.0, 100.0)
    policy.step([stats(85.0)], 0.0, 10.0)                         # at the aim, no budget
    back = policy.step([stats(60.0)], BIG_BUDGET, 10.0).extra_candidates
    assert back <= (CONFIG.max_step or 0.0)                                 # ramps from zero again


def test_a_target_at_every_candidate_the_callers_offer_is_limited_by_demand_not_max() -> None:
    policy = RmaPolicy(CONFIG)
    for _ in range(60):
        top = policy.step([stats(10.0)], BIG_BUDGET, 10.0, supply=64)
    assert (top.extra_candidates, top.limited_by) == (64, "demand")
    assert policy.pid.output <= 64.0                      # no wind-up past what is offered
    assert policy.step([stats(10.0)], BIG_BUDGET, 10.0, supply=500).limited_by == "sla"


def test_the_supply_is_the_largest_offer_of_the_last_periods_and_unknown_until_one() -> None:
    supply = CandidateSupply(periods=2)
    assert supply.most is None
    supply.observe(None)                                  # a client before contract v6
    assert supply.most is None
    for offered in (16, 256, 40):
        supply.observe(offered)
    assert supply.most == 256
    supply.close_period()
    supply.close_period()                                 # a period without records
    supply.observe(8)
    supply.close_period()
    assert supply.most == 256
    supply.observe(8)
    supply.close_period()
    assert supply.most == 8                               # the 256 is two periods old


def at_200(state: RmaState) -> RmaPolicy:
    """A policy whose last target sent 200 extras a request (the configured maximum)."""
    policy = RmaPolicy(CONFIG, state)
    policy.pid.move_to(200.0)
    return policy


def trimmed(p99_ms: float, shed_per_request: float, *, rate: float = 100.0) -> WindowStats:
    return msgspec.structs.replace(stats(p99_ms, rate=rate),
                                   overload_shed_rate=shed_per_request * rate)


def test_a_target_the_replicas_trim_is_held_near_what_they_served_limited_by_capacity() -> None:
    policy = at_200(RmaState(issued=200))
    # every request carried 200 extras and the replicas shed 160 of them to fit their bound:
    # the latency is fine (trimming keeps it so), but the target runs far past the capacity
    target = policy.step([trimmed(40.0, 160.0)], BIG_BUDGET, 10.0)
    assert target.extra_candidates == math.floor(40 * 1.5)
    assert target.limited_by == "capacity"
    # once they serve what it sends, the cap grows again, by a ratio a period
    grown = [policy.step([trimmed(40.0, 0.0)], BIG_BUDGET, 10.0).extra_candidates
             for _ in range(3)]
    assert grown == sorted(grown) and grown[0] > 60 and grown[-1] <= 200


def test_a_trim_within_the_tolerance_does_not_cap_the_target() -> None:
    policy = at_200(RmaState(issued=100))
    target = policy.step([trimmed(40.0, 10.0)], BIG_BUDGET, 10.0)
    assert target.limited_by != "capacity"
    assert policy.state.served is None


def test_overload_shed_in_a_burst_period_does_not_cut_the_served_cap() -> None:
    policy = at_200(RmaState(issued=200, rates=[100.0] * 5))
    # the request rate tripled: the replicas' surge rule shed optional work, not a target
    target = policy.step([trimmed(40.0, 160.0, rate=300.0)], BIG_BUDGET, 10.0)
    assert target.limited_by != "capacity"
    assert policy.state.served is None


def test_the_served_cap_survives_a_restart() -> None:
    policy = at_200(RmaState(issued=200))
    policy.step([trimmed(40.0, 160.0)], BIG_BUDGET, 10.0)
    state = msgspec.json.decode(msgspec.json.encode(policy.state), type=RmaState)
    assert state.served == pytest.approx(60.0)
    assert state.issued == 60


def roomy(p99_ms: float, room: int | None, *, rate: float = 100.0,
          pool: str = RANK_POOL) -> WindowStats:
    return msgspec.structs.replace(stats(p99_ms, rate=rate, pool=pool), extras_room=room)


def test_a_target_is_held_to_the_most_one_request_could_carry_limited_by_capacity() -> None:
    policy = at_200(RmaState(issued=100))
    # one replica could take 64 extras on a request at best, the other 40: a target past the
    # larger is trimmed on every request, whichever replica it lands on
    target = policy.step([roomy(40.0, 64), roomy(40.0, 40, pool=RANK_BASE_POOL)],
                         BIG_BUDGET, 10.0)
    assert (target.extra_candidates, target.limited_by) == (64, "capacity")
    # the latency loop is not cut by it: once the replicas have room, the target is back
    assert policy.pid.output > 64
    back = policy.step([roomy(40.0, 500)], BIG_BUDGET, 10.0)
    assert back.extra_candidates > 64 and back.limited_by != "capacity"


def test_without_a_measured_room_the_target_is_not_held() -> None:
    policy = at_200(RmaState(issued=100))
    assert policy.step([roomy(40.0, None)], BIG_BUDGET, 10.0).extra_candidates > 64


def test_a_bursts_small_room_does_not_cut_the_target_the_last_one_holds() -> None:
    policy = at_200(RmaState(issued=100, rates=[100.0] * 5))
    assert policy.step([roomy(40.0, 64)], BIG_BUDGET, 10.0).extra_candidates == 64
    # the request rate tripled: the replicas are full for the burst, not smaller
    burst = policy.step([roomy(40.0, 3, rate=300.0)], BIG_BUDGET, 10.0)
    assert burst.extra_candidates == 64
    state = msgspec.json.decode(msgspec.json.encode(policy.state), type=RmaState)
    assert state.room == 64                              # and a restart keeps it


def test_a_zero_target_without_allocated_accelerators_is_limited_by_capacity() -> None:
    policy = RmaPolicy(CONFIG)
    target = policy.step([stats(50.0)], 0.0, 10.0, unallocated=True)
    assert (target.extra_candidates, target.limited_by) == (0, "capacity")
    assert policy.limited_by == "capacity"


def test_a_target_held_without_any_ranking_traffic_is_limited_by_demand() -> None:
    policy = RmaPolicy(CONFIG)
    held = policy.step([stats(50.0, rate=0.0, enough=False)], BIG_BUDGET, 10.0)
    assert held.limited_by == "demand"
    thin = RmaPolicy(CONFIG).step([stats(50.0, rate=5.0, enough=False)], BIG_BUDGET, 10.0)
    assert thin.limited_by == "hold"  # traffic too thin to judge is not a want of demand
