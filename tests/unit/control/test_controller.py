from __future__ import annotations

import msgspec
import pytest

from schemas.codec import decode, encode
from schemas.contract import ControlTargets, PreemptionNotice
from streams.control.config import ControlConfig, with_overrides
from streams.control.controller import (
    ControllerState,
    ScopeController,
    ScopeMismatch,
    decode_state,
    encode_state,
)
from tests.unit.control.factories import (
    POWERFUL_POOL,
    RANK_BASE_POOL,
    RANK_POOL,
    grant,
    notice,
    outcome,
    report,
)

PERIOD_MS = 10_000
FOREVER = 10**12
#: Fixed steps (no slow start) so each test can pin how far one period may move a target.
CONFIG = with_overrides(ControlConfig(), {"rma.max_step": 8.0, "sbm.max_increase_per_period": 0.02,
                                          "rma.slow_start_below": 0.0,
                                          "sbm.slow_start_below": 0.0})
MAX_STEP = 8.0


def feed_period(c: ScopeController, t0: int, *, rank_p99: float = 30.0,
                powerful_p99: float = 100.0, samples: int = 100,
                powerful_capacity_rps: float = 60.0) -> int:
    """One control period of reports: two ranking workers, one powerful worker."""
    for second in range(PERIOD_MS // 1000):
        start, end = t0 + second * 1000, t0 + (second + 1) * 1000
        for worker in ("w1", "w2"):
            c.on_report(report(RANK_POOL, worker=worker, p99_ms=rank_p99, samples=samples,
                               start_ms=start, end_ms=end), end)
        c.on_report(report(POWERFUL_POOL, worker="p1", p99_ms=powerful_p99, samples=samples,
                           start_ms=start, end_ms=end, capacity_rps=powerful_capacity_rps), end)
    return t0 + PERIOD_MS


def granted(config: ControlConfig = CONFIG, *, pools: tuple[str, ...] = (RANK_POOL,
                                                                         POWERFUL_POOL),
            ) -> ScopeController:
    c = ScopeController("eu1", config)
    for pool in pools:
        c.on_capacity(grant(pool, accel=8.0, cpu=64.0, expires_at_ms=FOREVER), 0)
    return c


def run(c: ScopeController, t: int, periods: int, **kw: float) -> tuple[int, ControlTargets]:
    targets = None
    for _ in range(periods):
        t = feed_period(c, t, **kw)  # type: ignore[arg-type]
        targets = c.tick(t)
    assert targets is not None
    return t, targets


def fast_path(c: ScopeController, n: PreemptionNotice, now_ms: int) -> ControlTargets:
    """The targets a notice that changes them publishes at once."""
    targets = c.on_preemption(n, now_ms)
    assert targets is not None
    return targets


def test_low_latency_and_spare_capacity_turn_on_both_levers() -> None:
    c = granted()
    _, targets = run(c, 0, 4)
    assert targets.rma.extra_candidates > 0 and targets.rma.budget_units_per_s > 0
    assert targets.sbm.coverage > 0
    assert targets.scope == "eu1" and targets.reason == "period"
    assert targets.issued_at_ms == 4 * PERIOD_MS and targets.ttl_ms == 30_000
    assert decode(ControlTargets, encode(targets)) == targets     # within the contract
    assert [w.pool_id for w in c.last_windows] == sorted([RANK_POOL, POWERFUL_POOL])


def test_epoch_strictly_increases_across_ticks_and_fast_path() -> None:
    c = granted()
    epochs = []
    t = 0
    for i in range(6):
        t = feed_period(c, t)
        epochs.append(c.tick(t).epoch)
        if i % 2:
            epochs.append(fast_path(c, notice(POWERFUL_POOL, ts_ms=t), t).epoch)
    assert epochs == sorted(set(epochs)) and epochs[0] == 1
    assert c.epoch == epochs[-1]


def test_restore_continues_epoch_and_state_round_trips_through_json() -> None:
    c = granted()
    c.on_outcome(outcome("new-users", "powerful", 0.4), 0)
    t, last = run(c, 0, 3)
    payload = encode_state(c.snapshot())
    state = decode_state(payload)
    assert state == c.snapshot()
    restored = ScopeController("eu1", CONFIG, state)
    assert restored.epoch == last.epoch
    assert encode_state(restored.snapshot()) == payload
    t = feed_period(restored, t)
    assert restored.tick(t).epoch == last.epoch + 1


def test_whole_pool_preemption_zeroes_optional_work_at_once() -> None:
    c = granted(pools=(RANK_POOL,))       # one pool carries all spare capacity
    t, before = run(c, 0, 4)
    assert before.rma.extra_candidates > 0 and before.sbm.coverage > 0
    fast = fast_path(c, notice(RANK_POOL, ts_ms=t + 5), t + 5)
    assert fast.reason == "preemption"
    assert fast.rma.extra_candidates == 0 and fast.rma.budget_units_per_s == 0.0
    assert fast.sbm.coverage == 0.0
    assert fast.epoch == before.epoch + 1 and fast.issued_at_ms == t + 5


def test_partial_preemption_lowers_but_never_raises() -> None:
    c = granted()
    t, before = run(c, 0, 4)
    fast = fast_path(c, notice(POWERFUL_POOL, ts_ms=t + 5), t + 5)
    assert fast.sbm.coverage == 0.0                    # the only powerful pool is gone
    assert fast.rma.extra_candidates <= before.rma.extra_candidates
    assert fast.sbm.segments == before.sbm.segments


def test_a_repeated_notice_sends_nothing_new_but_a_further_reclaim_does() -> None:
    c = granted()
    t, before = run(c, 0, 4)
    first = c.on_preemption(notice(POWERFUL_POOL, ts_ms=t + 5), t + 5)
    assert first is not None and first.sbm.coverage == 0.0 < before.sbm.coverage
    # The scheduler re-announces the same reclaim until its deadline: the targets out already
    # say all of it
    assert c.on_preemption(notice(POWERFUL_POOL, ts_ms=t + 25), t + 25) is None
    assert c.epoch == first.epoch
    second = c.on_preemption(notice(RANK_POOL, ts_ms=t + 45), t + 45)   # the rest goes too
    assert second is not None and second.epoch == first.epoch + 1
    assert second.rma.extra_candidates == 0 < first.rma.extra_candidates


def _reclaimed_and_returned(**between: float) -> tuple[ControlTargets, ControlTargets]:
    """Targets before a whole-pool reclaim, and the first period's after the capacity came back
    (``between``: the reports of one period spent without it)."""
    c = granted(pools=(RANK_POOL,))
    t, before = run(c, 0, 6)
    c.on_preemption(notice(RANK_POOL, ts_ms=t + 5), t + 5)
    if between:
        t, _ = run(c, t, 1, **between)
    c.on_capacity(grant(RANK_POOL, accel=8.0, cpu=64.0, ts_ms=t + 6, expires_at_ms=FOREVER),
                  t + 6)
    _, after = run(c, t, 1)
    return before, after


def test_capacity_returning_resumes_what_the_latency_loop_had_reached_and_no_more() -> None:
    before, after = _reclaimed_and_returned()
    assert before.rma.extra_candidates > 2 * MAX_STEP
    assert after.rma.extra_candidates == before.rma.extra_candidates   # not a ramp from zero
    assert 0.0 < after.sbm.coverage <= before.sbm.coverage


def test_a_tail_at_the_aim_since_the_reclaim_ramps_again_from_zero() -> None:
    before, after = _reclaimed_and_returned(rank_p99=CONFIG.rma.setpoint_ms + 5.0)
    assert before.rma.extra_candidates > MAX_STEP
    assert after.rma.extra_candidates <= MAX_STEP


def test_first_tick_after_restore_is_held_to_the_last_targets() -> None:
    c = granted()
    t, last = run(c, 0, 3)              # mid-ramp: without a ceiling the next tick would rise
    twin = ScopeController("eu1", CONFIG, decode_state(encode_state(c.snapshot())))
    _, would = run(c, t, 1)
    assert would.rma.extra_candidates > last.rma.extra_candidates
    assert would.sbm.coverage > last.sbm.coverage
    _, first = run(twin, t, 1)
    assert first.reason == "restart"
    assert first.rma.extra_candidates <= last.rma.extra_candidates
    assert first.sbm.coverage <= last.sbm.coverage
    assert first.rma.budget_units_per_s <= last.rma.budget_units_per_s
    _, second = run(twin, t + PERIOD_MS, 1)
    assert second.reason == "period"
    assert second.rma.extra_candidates <= last.rma.extra_candidates + MAX_STEP


def test_restore_without_previous_targets_starts_from_nothing() -> None:
    state = ControllerState(scope="eu1")
    c = ScopeController("eu1", CONFIG, state)
    for pool in (RANK_POOL, POWERFUL_POOL):
        c.on_capacity(grant(pool, accel=8.0, cpu=64.0, expires_at_ms=FOREVER), 0)
    _, first = run(c, 0, 1)
    assert first.rma.extra_candidates == 0 and first.sbm.coverage == 0.0


def test_window_with_too_few_samples_does_not_move_the_controller() -> None:
    c = granted()
    t, before = run(c, 0, 3)
    pid_before = c.snapshot().rma
    t, held = run(c, t, 1, rank_p99=5.0, powerful_p99=5.0, samples=2)
    assert not any(w.enough_samples for w in c.last_windows)
    assert held.rma.extra_candidates == before.rma.extra_candidates
    assert held.sbm.coverage == before.sbm.coverage
    assert c.snapshot().rma == pid_before


def test_high_latency_cuts_extra_work() -> None:
    c = granted()
    t, before = run(c, 0, 5)
    _, after = run(c, t, 1, rank_p99=CONFIG.rma.sla_p99_ms * 1.5)
    assert after.rma.extra_candidates < before.rma.extra_candidates


def test_a_slow_powerful_pool_caps_its_requests_extras_first_and_only_then_says_v5() -> None:
    c = granted()
    t, before = run(c, 0, 5)
    assert before.v == 2 and before.sbm.extra_candidates is None
    assert before.rma.extra_candidates > 0
    t, slow = run(c, t, 1, powerful_p99=CONFIG.sbm.sla_p99_ms * 1.5)
    assert slow.sbm.coverage == before.sbm.coverage
    assert slow.sbm.extra_candidates is not None
    assert slow.sbm.extra_candidates < slow.rma.extra_candidates
    assert slow.v == 5 and decode(ControlTargets, encode(slow)) == slow
    _, recovered = run(c, t, 20)
    assert recovered.sbm.extra_candidates is None and recovered.v == 2


def test_rma_holds_its_target_to_what_one_request_could_carry_and_says_capacity() -> None:
    from msgspec import structs

    c = granted()
    t, before = run(c, 0, 5)
    room = before.rma.extra_candidates // 2
    for second in range(PERIOD_MS // 1000):             # its requests could carry half of it
        start, end = t + second * 1000, t + (second + 1) * 1000
        for worker in ("w1", "w2"):
            c.on_report(structs.replace(report(RANK_POOL, worker=worker, p99_ms=30.0,
                                               start_ms=start, end_ms=end),
                                        v=10, extras_room=room), end)
    narrow = c.tick(t + PERIOD_MS)
    assert (narrow.rma.extra_candidates, narrow.rma.limited_by) == (room, "capacity")
    assert narrow.v == 2                                # the targets' contract is unchanged


def test_rma_stops_at_the_candidates_callers_offer_and_says_demand() -> None:
    c = granted()
    t = 0
    for _ in range(30):
        c.on_outcome(msgspec.structs.replace(outcome("s", "baseline", 1.0), v=6, available=12),
                     t)
        t, targets = run(c, t, 1)
    assert (targets.rma.extra_candidates, targets.rma.limited_by) == (12, "demand")


def test_lapsed_grants_stop_optional_work() -> None:
    c = ScopeController("eu1", CONFIG)
    c.on_capacity(grant(RANK_POOL, accel=8.0, cpu=64.0, expires_at_ms=25_000), 0)
    _, on = run(c, 0, 2)
    assert on.rma.extra_candidates > 0
    _, off = run(c, 2 * PERIOD_MS, 1)
    assert off.rma.extra_candidates == 0 and off.sbm.coverage == 0.0


def test_same_inputs_give_byte_identical_targets() -> None:
    def drive() -> list[bytes]:
        c = granted()
        out = []
        t = 0
        for i in range(8):
            c.on_outcome(outcome(f"seg-{i % 3}", "powerful" if i % 2 else "baseline",
                                 0.1 * i), t)
            t = feed_period(c, t, rank_p99=30.0 + 10 * (i % 4))
            out.append(encode(c.tick(t)))
            if i == 5:
                out.append(encode(fast_path(c, notice(POWERFUL_POOL, ts_ms=t), t)))
        out.append(encode_state(c.snapshot()))
        return out

    assert drive() == drive()


def test_events_for_another_scope_are_refused() -> None:
    c = ScopeController("eu1", CONFIG)
    other = "us2/rank/baseline/a100/opportunistic"
    with pytest.raises(ScopeMismatch):
        c.on_report(report(other), 0)
    with pytest.raises(ScopeMismatch):
        c.on_capacity(grant(other), 0)
    with pytest.raises(ScopeMismatch):
        c.on_preemption(notice(other), 0)
    with pytest.raises(ScopeMismatch):
        c.on_outcome(msgspec.structs.replace(outcome("s", "baseline", 1.0), scope="us2"), 0)
    with pytest.raises(ValueError, match="scope"):
        ScopeController("us2", CONFIG, ControllerState(scope="eu1"))


def test_segments_reach_the_targets() -> None:
    c = granted()
    for _ in range(20):
        c.on_outcome(outcome("new-users", "baseline", 1.0), 0)
        c.on_outcome(outcome("new-users", "powerful", 1.5), 0)
    _, targets = run(c, 0, 1)
    seg = targets.sbm.segments["new-users"]
    assert seg.observations == 40 and seg.gain_mean > 0


def test_preemption_before_any_tick_issues_nothing_optional() -> None:
    c = granted()
    fast = fast_path(c, notice(POWERFUL_POOL, ts_ms=5), 5)
    assert fast.epoch == 1 and fast.reason == "preemption"
    assert fast.rma.extra_candidates == 0 and fast.sbm.coverage == 0.0


def test_no_traffic_seen_means_no_capacity_handed_to_levers() -> None:
    c = granted()
    targets = c.tick(PERIOD_MS)
    assert c.allocation.rma_accel == {} and c.allocation.sbm_accel == {}
    assert targets.rma.extra_candidates == 0 and targets.sbm.coverage == 0.0


def test_provisioned_ranking_replicas_lend_nothing_unless_the_operator_allows() -> None:
    c = granted(pools=())
    t = feed_period(c, 0)
    assert c.tick(t).rma.budget_units_per_s == 0.0


def test_provisioned_ranking_replicas_with_room_add_to_the_rma_budget() -> None:
    config = with_overrides(CONFIG, {"cost.provisioned_utilisation": 0.5})
    c = granted(config, pools=())               # nothing lent at all
    t = 0
    for _ in range(3):
        for second in range(PERIOD_MS // 1000):
            start, end = t + second * 1000, t + (second + 1) * 1000
            # 20% busy for 100 requests of one unit: 500 units/s when busy all the time
            c.on_report(report(RANK_BASE_POOL, p99_ms=30.0, start_ms=start, end_ms=end,
                               utilisation=0.2, units_done=100), end)
        t += PERIOD_MS
        targets = c.tick(t)
    room = 0.5 * 500.0 - 100.0                 # to provisioned_utilisation, less baseline work
    assert targets.rma.extra_candidates == 1    # the room over 100 requests/s, whole candidates
    assert targets.rma.budget_units_per_s == pytest.approx(min(room, 1 * 100.0))  # its spend


def test_a_lent_pool_whose_replicas_serve_one_model_is_planned_for_that_lever_only() -> None:
    c = ScopeController("eu1", CONFIG)     # RANK_POOL's replicas rank, POWERFUL_POOL's do not
    c.on_capacity(grant(RANK_POOL, accel=2.0, cpu=64.0, expires_at_ms=FOREVER), 0)
    c.on_capacity(grant(POWERFUL_POOL, accel=14.0, cpu=64.0, expires_at_ms=FOREVER), 0)
    run(c, 0, 2)
    assert c.capacity.pinned == {"baseline": {"a100": 2.0}, "powerful": {"a100": 14.0}}
    assert c.allocation.rma_accel == {"a100": 2.0}  # unpinned, RMA's curve would take more


def test_lent_units_stay_fungible_while_a_replica_reports_from_a_pool_without_a_grant() -> None:
    c = granted(pools=(RANK_POOL,))        # the powerful replica runs on RANK_POOL's units
    run(c, 0, 2)
    assert c.allocation.sbm_accel_units > 0
