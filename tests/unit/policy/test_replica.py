"""One replica's decisions on optional work: extra candidates, budget share, notices, resume."""

from __future__ import annotations

from schemas.contract import ControlTargets, PreemptionNotice, RmaTarget, SbmTarget
from workers.policy.replica import ReplicaPolicy
from workers.policy.targets import LocalLimits

POOL = "eu1/rank/baseline/l4/opportunistic"


def _policy(share: float = 1.0, started_ms: int = 0, worker_id: str = "w1") -> ReplicaPolicy:
    return ReplicaPolicy(pool_id=POOL, worker_id=worker_id, region="eu1",
                         limits=LocalLimits(max_extra_candidates=16), budget_share=share,
                         started_ms=started_ms)


def _targets(epoch: int, extra: int = 8, budget: float = 100.0, at: int = 0) -> ControlTargets:
    return ControlTargets(scope="eu1", epoch=epoch, issued_at_ms=at, ttl_ms=10_000,
                          rma=RmaTarget(extra_candidates=extra, budget_units_per_s=budget),
                          sbm=SbmTarget(coverage=0.5))


def _notice(notice_id: str = "n1", replicas: tuple[str, ...] = (), deadline: int = 5_000,
            pool: str = POOL, ts: int = 0) -> PreemptionNotice:
    return PreemptionNotice(notice_id=notice_id, ts_ms=ts, region="eu1", pool_id=pool,
                            replicas=list(replicas), deadline_ms=deadline)


def test_without_targets_every_extra_candidate_is_refused_as_stale() -> None:
    policy = _policy()
    allowance = policy.allow_extra(policy.current(0), 5)
    assert (allowance.allowed, allowance.refused, allowance.new_budget) == (0, "stale_targets",
                                                                          None)


def test_extra_candidates_are_capped_by_the_target_and_the_rest_named_over_target() -> None:
    policy = _policy()
    policy.offer(_targets(1, extra=3), 0, admission_preempted=False)
    allowance = policy.allow_extra(policy.current(1), 5)
    assert (allowance.allowed, allowance.refused) == (3, "over_target")
    assert policy.allow_extra(policy.current(1), 2).refused is None


def test_the_budget_is_this_replicas_share_and_reported_only_when_it_changes() -> None:
    policy = _policy(share=0.25)
    policy.offer(_targets(1, budget=400.0), 0, admission_preempted=False)
    assert policy.allow_extra(policy.current(1), 1).new_budget == 100.0
    assert policy.allow_extra(policy.current(2), 1).new_budget is None
    policy.budget_share = 0.5
    assert policy.allow_extra(policy.current(3), 1).new_budget == 200.0


def test_the_budget_banks_five_requests_worth_of_the_target_and_follows_it() -> None:
    policy = _policy()
    policy.offer(_targets(1, extra=8, budget=100.0), 0, admission_preempted=False)
    first = policy.allow_extra(policy.current(1), 1)
    assert (first.new_budget, first.banked_units) == (100.0, 40.0)
    policy.offer(_targets(2, extra=4, budget=100.0), 2, admission_preempted=False)
    moved = policy.allow_extra(policy.current(3), 1)
    assert (moved.new_budget, moved.banked_units) == (100.0, 20.0)   # the same budget, resent


def test_no_extra_requested_decides_nothing() -> None:
    policy = _policy()
    policy.offer(_targets(1), 0, admission_preempted=False)
    assert policy.allow_extra(policy.current(1), 0).new_budget is None


def test_a_whole_request_is_refused_while_baseline_only_and_named_for_why() -> None:
    policy = _policy()
    assert policy.whole_refusal(policy.current(0)) == "stale_targets"
    policy.offer(_targets(1), 0, admission_preempted=False)
    assert policy.whole_refusal(policy.current(1)) is None
    policy.on_notice(_notice(), 2)
    assert policy.whole_refusal(policy.current(3)) == "preemption"


def test_a_whole_requests_extras_are_held_to_the_cap_the_sbm_target_sets_on_them() -> None:
    policy = _policy()
    policy.offer(_targets(1, extra=8), 0, admission_preempted=False)
    uncapped = policy.allow_whole_extra(policy.current(1), 10)
    assert (uncapped.allowed, uncapped.refused) == (8, "over_target")
    capped = ControlTargets(v=5, scope="eu1", epoch=2, issued_at_ms=0, ttl_ms=10_000,
                            rma=RmaTarget(extra_candidates=8, budget_units_per_s=100.0),
                            sbm=SbmTarget(coverage=0.5, extra_candidates=3))
    policy.offer(capped, 0, admission_preempted=False)
    allowance = policy.allow_whole_extra(policy.current(1), 10)
    assert (allowance.allowed, allowance.refused) == (3, "over_target")
    assert policy.allow_whole_extra(policy.current(1), 2).refused is None
    assert policy.allow_extra(policy.current(1), 10).allowed == 8   # ranking extras: RMA's


def test_a_notice_applies_once_only_to_its_pool_or_named_replicas() -> None:
    policy = _policy()
    assert policy.on_notice(_notice(pool="eu1/other"), 0) == "not_mine"
    assert policy.on_notice(_notice(replicas=("w2",)), 0) == "not_mine"
    assert policy.on_notice(_notice(replicas=("w1",)), 0) == "applied"
    assert policy.on_notice(_notice(replicas=("w1",)), 1) == "duplicate"
    assert policy.current(1).baseline_only and policy.current(1).reason == "preempted"


def test_a_notice_at_or_past_its_deadline_stops_optional_work_at_once() -> None:
    for deadline in (100, 50):                    # zero notice; arrived after its deadline
        policy = _policy()
        policy.offer(_targets(1), 0, admission_preempted=False)
        assert policy.on_notice(_notice(ts=100, deadline=deadline), 120) == "applied"
        assert policy.current(120).reason == "preempted"
        assert policy.allow_extra(policy.current(120), 4).refused == "preemption"


def test_a_reclaim_the_replica_outlived_is_stale_one_still_pending_applies() -> None:
    policy = _policy(started_ms=1_000)
    policy.offer(_targets(1, at=1_000), 1_000, admission_preempted=False)
    assert policy.on_notice(_notice(ts=900, deadline=1_005), 1_010) == "stale"
    assert not policy.current(1_010).baseline_only
    assert policy.on_notice(_notice("n2", ts=900, deadline=60_000), 1_010) == "applied"
    assert policy.current(1_010).reason == "preempted"


def test_an_earlier_incarnations_own_shutdown_notice_is_stale_for_its_successor() -> None:
    """A replica restarted under the same id (a StatefulSet pod, the demo's replicas) reads
    back the notice its predecessor published on SIGTERM, whose deadline is the old process's
    grace period: it must not stop the new process's optional work."""
    before = _policy(started_ms=0)
    own = before.shutdown_notice_id(900)
    policy = _policy(started_ms=1_000)
    policy.offer(_targets(1, at=1_000), 1_000, admission_preempted=False)
    me = policy.worker_id
    assert policy.on_notice(_notice(own, replicas=(me,), ts=900, deadline=30_900), 1_010) \
        == "stale"
    assert not policy.current(1_010).baseline_only
    other = _policy(worker_id="w2").shutdown_notice_id(900)
    assert policy.on_notice(_notice(other, ts=900, deadline=30_900), 1_010) == "applied"


def test_a_zero_notice_reclaim_after_the_start_applies() -> None:
    policy = _policy(started_ms=1_000)
    assert policy.on_notice(_notice(ts=1_000, deadline=1_000), 1_010) == "applied"


def test_new_targets_after_a_preemption_resume_only_when_issued_after_it() -> None:
    policy = _policy()
    policy.offer(_targets(1, at=0), 0, admission_preempted=False)
    policy.on_notice(_notice(), 100)
    verdict, resume = policy.offer(_targets(2, at=50), 120, admission_preempted=True)
    assert (verdict.accepted, resume) == (False, False)
    verdict, resume = policy.offer(_targets(3, at=150), 160, admission_preempted=True)
    assert (verdict.accepted, resume) == (True, True)
    assert policy.offer(_targets(4, at=170), 170, admission_preempted=False)[1] is False


def test_a_reclaimed_replica_does_no_optional_work_from_its_deadline_whatever_targets_say(
) -> None:
    """Newer targets issued after the notice resume it before the deadline; from the deadline
    on every extra and every whole request is refused (``preemption``), and targets issued
    after it (scope-wide: they cannot say this replica is lent again) do not resume it."""
    policy = _policy()
    policy.offer(_targets(1, at=0), 0, admission_preempted=False)
    assert policy.on_notice(_notice(ts=100, deadline=1_000), 110) == "applied"
    assert policy.offer(_targets(2, at=200), 210, admission_preempted=True)[1] is True
    assert policy.allow_extra(policy.current(999), 4).allowed == 4
    assert not policy.reclaimed(999) and policy.reclaimed(1_000)
    after = policy.current(1_000)
    assert after.baseline_only and after.reason == "preempted" and after.epoch == 2
    assert policy.allow_extra(after, 4).refused == "preemption"
    assert policy.whole_refusal(after) == "preemption"
    verdict, resume = policy.offer(_targets(3, at=1_100), 1_110, admission_preempted=True)
    assert (verdict.accepted, resume) == (True, False)
    assert policy.current(1_200).baseline_only


def test_a_zero_notice_reclaim_is_never_resumed_and_the_earliest_deadline_counts() -> None:
    policy = _policy()
    policy.offer(_targets(1, at=0), 0, admission_preempted=False)
    policy.on_notice(_notice("n1", ts=100, deadline=5_000), 105)
    policy.on_notice(_notice("n2", ts=130, deadline=130), 140)       # zero notice
    verdict, resume = policy.offer(_targets(2, at=150), 160, admission_preempted=True)
    assert (verdict.accepted, resume) == (True, False)
    assert policy.current(160).baseline_only


def test_the_notice_memory_is_bounded() -> None:
    policy = ReplicaPolicy(pool_id=POOL, worker_id="w1", region="eu1", limits=LocalLimits(),
                           started_ms=0, notice_memory=2)
    for i in range(3):
        assert policy.on_notice(_notice(f"n{i}"), 0) == "applied"
    assert policy.on_notice(_notice("n0"), 0) == "applied"  # forgotten, the oldest
    assert policy.on_notice(_notice("n2"), 0) == "duplicate"
