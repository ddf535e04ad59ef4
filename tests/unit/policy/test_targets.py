"""Invariant 2 on the receiving side: anything untrustworthy means baseline only, counted."""

from __future__ import annotations

import msgspec
import pytest

from schemas.codec import decode, encode
from schemas.contract import ControlTargets, PrecomputeTarget
from schemas.signing import REFUSALS, Keyring, sign, verifier
from tests.unit.policy.helpers import T0, targets
from workers.policy.targets import LocalLimits, TargetState

KEY = b"shared-secret"


def _state(**limits: int | float) -> TargetState:
    return TargetState("eu1", LocalLimits(**limits))  # type: ignore[arg-type]


def test_nothing_received_means_baseline_only() -> None:
    eff = _state().current(T0)
    assert eff.baseline_only and eff.reason == "no_targets"
    assert (eff.extra_candidates, eff.coverage, eff.budget_units_per_s) == (0, 0.0, 0.0)


def test_fresh_target_is_applied_as_sent() -> None:
    state = _state()
    verdict = state.offer(targets(extra=64, coverage=0.25, segments={"a": (0.1, 0.01)}), T0 + 10)
    assert verdict.accepted and verdict.reason == "applied"
    eff = state.current(T0 + 20)
    assert not eff.baseline_only
    assert (eff.extra_candidates, eff.coverage, eff.budget_units_per_s) == (64, 0.25, 5000.0)
    assert eff.segments["a"].gain_mean == 0.1 and eff.epoch == 1
    assert state.counters == {"applied": 1}


def test_a_targets_precompute_share_reaches_the_replica_and_one_out_of_range_is_refused(
) -> None:
    state = _state()
    assert state.current(T0).precompute_share is None
    state.offer(targets(), T0)
    assert state.current(T0).precompute_share is None          # not set: the replica's own
    shared = msgspec.structs.replace(targets(epoch=2), v=13,
                                     precompute=PrecomputeTarget(share=0.5))
    assert state.offer(shared, T0).accepted
    assert state.current(T0).precompute_share == 0.5
    wild = msgspec.structs.replace(targets(epoch=3), v=13,
                                   precompute=PrecomputeTarget(share=1.5))
    assert state.offer(wild, T0).reason == "out_of_range"


def test_target_goes_baseline_only_when_its_ttl_passes_and_the_expiry_is_counted_once() -> None:
    state = _state()
    state.offer(targets(ttl_ms=1_000), T0)
    assert not state.current(T0 + 999).baseline_only
    for now in (T0 + 1_000, T0 + 5_000):
        eff = state.current(now)
        assert eff.baseline_only and eff.reason == "expired" and eff.epoch == 1
    assert state.counters["held_expired"] == 1


def test_ttl_beyond_local_limit_is_clamped_so_target_expires_sooner() -> None:
    state = _state(max_ttl_ms=2_000)
    verdict = state.offer(targets(ttl_ms=60_000), T0)
    assert verdict.accepted and verdict.reason == "clamped"
    assert not state.current(T0 + 1_999).baseline_only
    assert state.current(T0 + 2_000).baseline_only


@pytest.mark.parametrize(("offered", "reason"), [
    (targets(issued_at_ms=T0 - 30_000), "expired"),
    (targets(issued_at_ms=T0 + 5_001), "from_future"),
    (targets(scope="us1"), "wrong_scope"),
])
def test_untrustworthy_target_is_refused_and_counted(offered: ControlTargets, reason: str) -> None:
    state = _state()
    verdict = state.offer(offered, T0)
    assert not verdict.accepted and verdict.reason == reason
    assert state.current(T0).baseline_only
    assert state.counters == {reason: 1}


def test_clock_skew_within_limit_is_tolerated() -> None:
    state = _state(max_clock_skew_ms=5_000)
    assert state.offer(targets(issued_at_ms=T0 + 5_000), T0).accepted


@pytest.mark.parametrize("skew_ms", [2_000, -2_000])
def test_a_skewed_receiver_keeps_each_target_for_its_whole_ttl_from_the_second_on(
        skew_ms: int) -> None:
    """Targets every second with a 3 s TTL, read 5 ms after they are issued, on a receiver
    whose clock is 2 s ahead of (or behind) the control plane's."""
    state = _state()
    for epoch in range(1, 6):
        issued = T0 + epoch * 1_000
        assert state.offer(targets(epoch=epoch, issued_at_ms=issued, ttl_ms=3_000),
                           issued + 5 + skew_ms).accepted
    last = T0 + 5_000 + skew_ms        # the last target's issue time on the receiver's clock
    assert not state.current(last + 2_999).baseline_only   # neither early (ahead) ...
    assert state.current(last + 3_005).baseline_only       # ... nor late (behind), past transit
    assert state.counters == {"applied": 5, "held_expired": 1}


def test_a_late_target_is_expired_on_the_senders_clock_once_the_offset_is_known() -> None:
    state = _state()
    state.offer(targets(epoch=1, issued_at_ms=T0, ttl_ms=3_000), T0 + 2_010)  # 2 s ahead
    late = targets(epoch=2, issued_at_ms=T0 + 1_000, ttl_ms=3_000)
    # 3.5 s after it was issued by the receiver's clock, 1.5 s by the sender's: still fresh
    assert state.offer(late, T0 + 4_500).accepted
    stale = targets(epoch=3, issued_at_ms=T0 + 2_000, ttl_ms=3_000)
    assert state.offer(stale, T0 + 7_100).reason == "expired"   # 3.09 s old by the sender


def test_behind_receiver_does_not_resume_on_targets_sent_before_its_preemption() -> None:
    state = _state()
    state.offer(targets(epoch=1, issued_at_ms=T0), T0 - 1_995)      # clock 2 s behind
    state.preempt(T0 + 1_000 - 2_000)        # the notice arrived at T0 + 1 s, sender's time
    before = targets(epoch=2, issued_at_ms=T0 + 500)   # sent 0.5 s before the preemption
    assert state.offer(before, T0 + 600 - 2_000).reason == "issued_before_preemption"
    after = targets(epoch=3, issued_at_ms=T0 + 1_200)
    assert state.offer(after, T0 + 1_205 - 2_000).accepted


def test_the_offset_estimate_is_bounded_by_the_allowed_skew() -> None:
    state = _state(max_clock_skew_ms=1_000)
    state.offer(targets(epoch=1, issued_at_ms=T0), T0 + 20_000)
    assert state.offset_ms() == 1_000


def test_older_or_equal_epoch_does_not_replace_the_held_target() -> None:
    state = _state()
    state.offer(targets(epoch=5, coverage=0.5), T0)
    assert state.offer(targets(epoch=4, coverage=0.9), T0 + 1).reason == "older_epoch"
    assert state.offer(targets(epoch=5, coverage=0.9), T0 + 1).reason == "duplicate_epoch"
    assert state.current(T0 + 2).coverage == 0.5
    assert state.offer(targets(epoch=6, coverage=0.9), T0 + 3).accepted
    assert state.current(T0 + 4).coverage == 0.9


def test_older_epoch_after_expiry_keeps_baseline_only() -> None:
    state = _state()
    state.offer(targets(epoch=5, ttl_ms=1_000), T0)
    assert state.current(T0 + 1_500).baseline_only
    assert not state.offer(targets(epoch=4, issued_at_ms=T0 + 1_400), T0 + 1_500).accepted
    assert state.current(T0 + 1_600).reason == "expired"


def test_values_above_local_limits_are_clamped_and_counted() -> None:
    state = _state(max_extra_candidates=32, max_coverage=0.2, max_budget_units_per_s=100.0)
    verdict = state.offer(targets(extra=64, coverage=0.25, budget=5_000.0), T0)
    assert verdict.accepted and verdict.reason == "clamped"
    eff = state.current(T0)
    assert (eff.extra_candidates, eff.coverage, eff.budget_units_per_s) == (32, 0.2, 100.0)
    assert state.held is not None and state.held.sbm.coverage == 0.2
    assert state.counters == {"clamped": 1}


@pytest.mark.parametrize("bad", [
    {"coverage": 1.5}, {"coverage": float("nan")}, {"budget": -1.0}, {"extra": -3},
    {"budget": float("inf")}, {"segments": {"a": (float("nan"), 0.1)}},
    {"segments": {"a": (0.1, -0.1)}},
])
def test_out_of_range_target_built_in_code_is_refused(bad: dict[str, object]) -> None:
    state = _state()
    verdict = state.offer(targets(**bad), T0)  # type: ignore[arg-type]
    assert not verdict.accepted and verdict.reason == "out_of_range"
    assert state.current(T0).baseline_only


def test_signed_target_is_accepted_after_crossing_the_wire() -> None:
    state = TargetState("eu1", LocalLimits(), verifier(KEY))
    signed = sign(targets(segments={"b": (0.2, 0.1), "a": (0.1, 0.01)}), KEY)
    wire = decode(ControlTargets, encode(signed))
    assert state.offer(wire, T0).accepted


def test_unsigned_target_is_refused_when_a_key_is_configured() -> None:
    state = TargetState("eu1", LocalLimits(), verifier(KEY))
    verdict = state.offer(targets(), T0)
    assert (verdict.accepted, verdict.reason) == (False, "unsigned")
    assert state.current(T0).baseline_only and state.counters == {"unsigned": 1}


@pytest.mark.parametrize("forge", ["other-key", "tamper", "garbage", "non-ascii"])
def test_forged_target_is_refused(forge: str) -> None:
    state = TargetState("eu1", LocalLimits(), verifier(KEY))
    good = sign(targets(coverage=0.1), KEY)
    forged = {
        "other-key": sign(targets(coverage=0.1), b"attacker"),
        "tamper": msgspec.structs.replace(
            good, sbm=msgspec.structs.replace(good.sbm, coverage=0.9)),
        "garbage": msgspec.structs.replace(good, signature="00" * 32),
        "non-ascii": msgspec.structs.replace(good, signature="é" * 64),
    }[forge]
    verdict = state.offer(forged, T0)
    assert (verdict.accepted, verdict.reason) == (False, "bad_signature")
    assert state.current(T0).baseline_only


def test_preempt_forces_baseline_until_a_newer_target_issued_after_it() -> None:
    state = _state()
    state.offer(targets(epoch=1), T0)
    state.preempt(T0 + 100)
    eff = state.current(T0 + 101)
    assert eff.baseline_only and eff.reason == "preempted"
    # Sent before the control plane knew of the preemption: newer epoch, but too early.
    early = state.offer(targets(epoch=2, issued_at_ms=T0 + 50), T0 + 102)
    assert (early.accepted, early.reason) == (False, "issued_before_preemption")
    assert state.current(T0 + 103).baseline_only
    assert not state.offer(targets(epoch=1, issued_at_ms=T0 + 200), T0 + 201).accepted
    assert state.offer(targets(epoch=3, issued_at_ms=T0 + 200), T0 + 201).accepted
    assert not state.current(T0 + 202).baseline_only
    assert state.counters["preempted"] == 1


def test_preempt_outlasts_the_ttl_of_the_held_target() -> None:
    state = _state()
    state.offer(targets(ttl_ms=1_000), T0)
    state.preempt(T0 + 10)
    assert state.current(T0 + 5_000).reason == "preempted"


def test_preempt_before_any_target_stays_baseline_until_one_arrives() -> None:
    state = _state()
    state.preempt(T0)
    assert state.current(T0 + 1).reason == "preempted"
    assert state.offer(targets(issued_at_ms=T0 + 10), T0 + 11).accepted


def test_limits_load_from_toml_and_a_bad_key_names_itself() -> None:
    limits = msgspec.toml.decode(b"max_coverage = 0.5\nmax_ttl_ms = 1000\n", type=LocalLimits)
    assert (limits.max_coverage, limits.max_ttl_ms) == (0.5, 1000)
    with pytest.raises(msgspec.ValidationError, match="max_covrage"):
        msgspec.toml.decode(b"max_covrage = 0.5\n", type=LocalLimits)


def test_a_receiver_ahead_by_more_than_the_ttl_learns_the_offset_from_a_rejected_target() -> None:
    state = _state()
    first = state.offer(targets(epoch=1, issued_at_ms=T0, ttl_ms=1_500), T0 + 2_005)
    assert first.reason == "expired"                  # raw clocks: nothing to go on yet
    second = state.offer(targets(epoch=2, issued_at_ms=T0 + 500, ttl_ms=1_500), T0 + 2_505)
    assert second.accepted
    assert not state.current(T0 + 2_500 + 1_499).baseline_only


def test_a_forged_target_teaches_nothing_about_the_clock() -> None:
    state = _state()
    state.offer(targets(scope="us1", issued_at_ms=T0 + 4_000), T0)
    assert state.offset_ms() == 0


def test_targets_age_is_read_on_the_senders_clock_and_is_none_before_any_target() -> None:
    state = _state()
    assert state.age_ms(T0) is None
    # a receiver 2 s ahead: two targets teach it the offset (each arrives 5 ms after issue)
    state.offer(targets(epoch=1, issued_at_ms=T0), T0 + 2_005)
    state.offer(targets(epoch=2, issued_at_ms=T0 + 1_000), T0 + 3_005)
    assert state.age_ms(T0 + 3_505) == 500


OLD_RING = Keyring({"old": KEY}, "old")
NEW_RING = Keyring({"new": b"next-secret"}, "new")


def test_an_expired_target_of_a_retired_key_is_dropped_as_expired_not_refused_for_its_key(
) -> None:
    """A reader started after the retirement reads the old key's last target back from the
    compacted topic: genuine, past its TTL, counted expired, not a signature refusal."""
    state = TargetState("eu1", LocalLimits(), NEW_RING.check)
    left_on_topic = OLD_RING.sign(targets(epoch=7, issued_at_ms=T0 - 30_000, ttl_ms=12_000))
    verdict = state.offer(left_on_topic, T0)
    assert (verdict.accepted, verdict.reason) == (False, "expired")
    assert verdict.reason not in REFUSALS            # so no receiver dead-letters it
    assert state.counters == {"expired": 1} and state.current(T0).baseline_only
    assert state.offer(NEW_RING.sign(targets(epoch=8, issued_at_ms=T0 + 5)), T0 + 10).accepted


def test_a_retired_keys_target_still_within_its_ttl_is_refused_for_its_key() -> None:
    state = TargetState("eu1", LocalLimits(), NEW_RING.check)
    fresh = OLD_RING.sign(targets(issued_at_ms=T0 - 1_000, ttl_ms=12_000))
    assert state.offer(fresh, T0).reason == "unknown_key"
    assert state.current(T0).baseline_only


@pytest.mark.parametrize("forge", ["unsigned", "attacker", "tamper"])
def test_a_forged_target_with_an_old_timestamp_is_never_applied_nor_trusted_for_the_clock(
        forge: str) -> None:
    """Expired before its signature is judged, a forgery is dropped (never applied) and its
    lag is not clock evidence: a genuine expired target's would set the offset."""
    old = targets(epoch=99, coverage=1.0, issued_at_ms=T0 - 4_000, ttl_ms=3_000)
    forged = {"unsigned": old, "attacker": sign(old, b"attacker"),
              "tamper": msgspec.structs.replace(sign(targets(issued_at_ms=T0 - 4_000,
                                                             ttl_ms=3_000), KEY),
                                                epoch=99, sbm=old.sbm)}[forge]
    state = TargetState("eu1", LocalLimits(), verifier(KEY))
    verdict = state.offer(forged, T0)
    assert (verdict.accepted, verdict.reason) == (False, "expired")
    assert state.held is None and state.current(T0).baseline_only
    assert state.offset_ms() == 0
    genuine = TargetState("eu1", LocalLimits(), verifier(KEY))
    assert genuine.offer(sign(old, KEY), T0).reason == "expired"
    assert genuine.offset_ms() == 4_000
