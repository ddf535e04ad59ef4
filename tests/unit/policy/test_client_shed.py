"""Client-side shedding cuts optional work fast, gives it back slowly, and never baseline."""

from __future__ import annotations

import pytest

from tests.unit.policy.helpers import T0, targets
from workers.api import ServerState
from workers.policy.admission import Admission, AdmissionConfig
from workers.policy.client_shed import BudgetBucket, ClientShedder, ShedConfig, extra_candidates
from workers.policy.targets import EffectiveTargets, LocalLimits, TargetState

CALM = ServerState(queue_delay_ms=1.0, in_flight=3, shedding_level=0)


def _state(**kw: object) -> ServerState:
    base: dict[str, object] = {"queue_delay_ms": 1.0, "in_flight": 3, "shedding_level": 0,
                               "preempted": False}
    base.update(kw)
    return ServerState(**base)  # type: ignore[arg-type]


def test_calm_servers_keep_full_allowance() -> None:
    shed = ClientShedder(ShedConfig())
    for i in range(100):
        shed.observe(CALM, T0 + i)
    assert shed.allowance(T0 + 100) == 1.0 and shed.counters == {}


@pytest.mark.parametrize(("signal", "reason"), [
    (_state(queue_delay_ms=50.0), "queue_delay"),
    (_state(shedding_level=2), "shedding_level_2"),
    (_state(preempted=True), "preempted"),
])
def test_struggling_server_cuts_allowance_at_once(signal: ServerState, reason: str) -> None:
    shed = ClientShedder(ShedConfig())
    shed.observe(signal, T0)
    assert shed.allowance(T0) <= 0.6
    assert shed.counters[reason] == 1 and shed.counters["cuts"] == 1


def test_a_worker_in_a_baseline_surge_makes_the_client_cut_at_its_next_response() -> None:
    cfg = AdmissionConfig(max_queue_delay_ms=10_000.0, initial_ms_per_unit=0.01)
    adm: Admission[str] = Admission(cfg)
    for t in range(0, 20_000, 10):  # steady: one baseline unit every 10 ms
        adm.admit_baseline("b", now_ms=t)
        adm.next_batch(10**6, now_ms=t)
    shed = ClientShedder(ShedConfig())

    def respond(now: int) -> None:
        state = adm.state(now)
        shed.observe(ServerState(queue_delay_ms=state.queue_delay_ms, in_flight=0,
                                 shedding_level=state.shedding_level), now)

    respond(20_000)
    assert shed.allowance(20_000) == 1.0
    t = 20_000
    while not adm.surging(t):  # the burst: a baseline unit every millisecond
        adm.admit_baseline("burst", now_ms=t)
        t += 1
    respond(t)  # no queue yet, but the worker says optional work is held back
    assert shed.allowance(t) < 1.0
    assert shed.counters["shedding_level_1"] == 1


def test_errors_and_timeouts_cut() -> None:
    shed = ClientShedder(ShedConfig(error_factor=0.5))
    shed.observe(None, T0, error="timeout")
    assert shed.allowance(T0) == 0.5 and shed.counters["timeout"] == 1


def test_in_flight_bound_is_used_only_when_set() -> None:
    busy = _state(in_flight=500)
    unbounded = ClientShedder(ShedConfig())
    unbounded.observe(busy, T0)
    bounded = ClientShedder(ShedConfig(max_in_flight=100))
    bounded.observe(busy, T0)
    assert unbounded.allowance(T0) == 1.0 and bounded.allowance(T0) == 0.5


def test_deeper_level_cuts_deeper() -> None:
    allowances = []
    for level in (1, 2, 3):
        shed = ClientShedder(ShedConfig())
        shed.observe(_state(shedding_level=level), T0)
        allowances.append(shed.allowance(T0))
    assert allowances[0] > allowances[1] > allowances[2]


def test_a_burst_of_bad_responses_is_one_cut_the_deepest_of_them() -> None:
    shed = ClientShedder(ShedConfig(cut_window_ms=100, overload_factor=0.5,
                                    preempted_factor=0.25))
    for i in range(50):
        shed.observe(_state(queue_delay_ms=80.0), T0 + i)
    assert shed.allowance(T0 + 50) == 0.5
    shed.observe(_state(preempted=True), T0 + 60)
    assert shed.allowance(T0 + 60) == 0.25
    assert shed.counters["cuts"] == 1 and shed.counters["queue_delay"] == 50


def test_persistent_trouble_keeps_cutting_once_per_window() -> None:
    shed = ClientShedder(ShedConfig(cut_window_ms=100, overload_factor=0.5))
    for t in range(0, 400, 10):
        shed.observe(_state(queue_delay_ms=80.0), T0 + t)
    assert shed.counters["cuts"] == 4
    assert shed.allowance(T0 + 399) == pytest.approx(0.5 ** 4, abs=0.01)


def test_recovery_is_additive_and_slow_after_the_cut_window() -> None:
    shed = ClientShedder(ShedConfig(cut_window_ms=100, recover_per_s=0.05, error_factor=0.5))
    shed.observe(None, T0, error="error")
    assert shed.allowance(T0 + 99) == 0.5          # nothing comes back inside the window
    assert shed.allowance(T0 + 1_100) == pytest.approx(0.55)
    assert shed.allowance(T0 + 5_100) == pytest.approx(0.75)
    assert shed.allowance(T0 + 20_000) == 1.0
    assert shed.allowance(T0 + 30_000) == 1.0


def test_cut_is_fast_and_recovery_slow_compared() -> None:
    shed = ClientShedder(ShedConfig())
    shed.observe(_state(shedding_level=3), T0)
    dropped = 1.0 - shed.allowance(T0)
    regained = shed.allowance(T0 + 1_000) - shed.allowance(T0)
    assert dropped > 5 * regained


def test_floor_keeps_some_optional_work() -> None:
    shed = ClientShedder(ShedConfig(floor=0.1, cut_window_ms=0))
    for t in range(20):
        shed.observe(_state(preempted=True), T0 + t)
    assert shed.allowance(T0 + 20) == pytest.approx(0.1, abs=0.002)


def _eff(extra: int = 64) -> EffectiveTargets:
    state = TargetState("eu1", LocalLimits())
    state.offer(targets(extra=extra), T0)
    return state.current(T0)


def test_extra_candidates_scale_with_allowance_and_availability() -> None:
    eff = _eff(64)
    assert extra_candidates(eff, 1.0, 500) == 64
    assert extra_candidates(eff, 0.5, 500) == 32
    assert extra_candidates(eff, 1.0, 10) == 10
    assert extra_candidates(eff, 0.0, 500) == 0
    assert extra_candidates(eff, 1.0, 0) == 0


def test_extra_candidates_are_zero_when_baseline_only() -> None:
    eff = TargetState("eu1", LocalLimits()).current(T0)
    assert extra_candidates(eff, 1.0, 500) == 0


def test_budget_bucket_grants_burst_then_rate() -> None:
    bucket = BudgetBucket(rate_per_s=100.0, burst=50.0)
    assert bucket.take(40, T0) == 40
    assert bucket.take(40, T0) == 10          # partial: what is left of the burst
    assert bucket.take(40, T0) == 0
    assert bucket.take(40, T0 + 100) == 10    # 100 ms at 100/s
    assert bucket.take(100, T0 + 10_000) == 50  # never more than the burst banked


def test_budget_bucket_ignores_time_running_backwards() -> None:
    bucket = BudgetBucket(rate_per_s=1000.0, burst=10.0)
    bucket.take(10, T0 + 1_000)
    assert bucket.take(10, T0) == 0
    assert bucket.take(10, T0 + 1_001) == 1


def test_budget_bucket_rate_change_keeps_tokens_within_new_burst() -> None:
    bucket = BudgetBucket(rate_per_s=100.0, burst=100.0)
    bucket.set_rate(0.0, 5.0)
    assert bucket.take(50, T0) == 5
    assert bucket.take(50, T0 + 60_000) == 0
    with pytest.raises(ValueError, match="rate_per_s"):
        bucket.set_rate(float("nan"), 1.0)


def test_a_level_with_factor_one_holds_the_allowance_where_it_is_without_cutting_it() -> None:
    shed = ClientShedder(ShedConfig(recover_per_s=1.0, cut_window_ms=100,
                                    level_factors=(1.0, 0.6, 0.3)))
    shed.observe(_state(shedding_level=1), T0)
    assert shed.allowance(T0) == 1.0 and "cuts" not in shed.counters
    shed.observe(_state(shedding_level=2), T0 + 200)         # cut to 0.6
    shed.observe(_state(shedding_level=1), T0 + 400)         # 0.7 by now: held there
    assert shed.allowance(T0 + 450) == pytest.approx(0.7)    # no growth in the hold's window
    assert shed.allowance(T0 + 600) == pytest.approx(0.8)    # grows again after it
    assert shed.counters == {"shedding_level_1": 2, "shedding_level_2": 1, "cuts": 1}


def test_the_powerful_pools_queue_is_judged_by_its_level_not_the_ranking_bound() -> None:
    shed = ClientShedder(ShedConfig(queue_delay_bound_ms=20.0), judge_queue_delay=False)
    shed.observe(_state(queue_delay_ms=50.0), T0)
    assert shed.allowance(T0) == 1.0 and shed.counters == {}
