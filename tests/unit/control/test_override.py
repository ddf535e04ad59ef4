"""Operator overrides: the pure rule (``streams.control.override``), the contract, and the
controller honouring them."""

from __future__ import annotations

import json

import msgspec
import pytest

from schemas.codec import ContractError, decode, encode
from schemas.contract import (
    OPERATOR_VERSION,
    ControlTargets,
    OperatorOverride,
    RmaTarget,
    SbmTarget,
)
from streams.control import override as operator
from streams.control.controller import ScopeController, ScopeMismatch, decode_state, encode_state
from streams.control.dispatch import RULES, dispatch
from tests.unit.control.factories import POWERFUL_POOL, RANK_POOL, notice
from tests.unit.control.test_controller import CONFIG, PERIOD_MS, fast_path, granted, run

HOUR_MS = 3_600_000
RMA = RmaTarget(extra_candidates=40, budget_units_per_s=900.0, limited_by="sla")
SBM = SbmTarget(coverage=0.3, limited_by="capacity")


def ov(**fields: object) -> OperatorOverride:
    base: dict[str, object] = {"scope": "eu1", "issued_at_ms": 0, "ttl_ms": HOUR_MS,
                               "reason": "incident"}
    base.update(fields)
    return OperatorOverride(**base)  # type: ignore[arg-type]


def last_targets(extra: int = 12, coverage: float = 0.1) -> ControlTargets:
    return ControlTargets(scope="eu1", epoch=3, issued_at_ms=0, ttl_ms=30_000,
                          rma=RmaTarget(extra_candidates=extra, budget_units_per_s=300.0),
                          sbm=SbmTarget(coverage=coverage))


# -- the pure rule -------------------------------------------------------------------------------


def test_kill_means_baseline_only_on_both_levers() -> None:
    rma, sbm = operator.apply(ov(kill=True), 10, RMA, SBM, None) or (None, None)
    assert rma == RmaTarget(extra_candidates=0, budget_units_per_s=0.0, limited_by="operator")
    assert sbm is not None and sbm.coverage == 0.0 and sbm.limited_by == "operator"


def test_caps_lower_only_what_is_over_them_and_say_so() -> None:
    rma, sbm = operator.apply(ov(max_extra=8, max_coverage=0.5), 10, RMA, SBM, None) or (RMA, SBM)
    assert (rma.extra_candidates, rma.limited_by) == (8, "operator")
    assert rma.budget_units_per_s == RMA.budget_units_per_s
    assert sbm == SBM  # 0.3 is under the 0.5 cap: untouched, still limited by capacity


def test_freeze_holds_the_last_targets_and_a_cap_still_applies_to_them() -> None:
    rma, sbm = operator.apply(ov(freeze=True), 10, RMA, SBM, last_targets()) or (RMA, SBM)
    assert (rma.extra_candidates, sbm.coverage) == (12, 0.1)
    assert rma.limited_by == sbm.limited_by == "operator"
    rma, _ = operator.apply(ov(freeze=True, max_extra=5), 10, RMA, SBM,
                            last_targets()) or (RMA, SBM)
    assert rma.extra_candidates == 5
    assert operator.apply(ov(freeze=True), 10, RMA, SBM, None) == operator.baseline_only(SBM)


def test_an_override_past_its_ttl_or_cleared_applies_nothing() -> None:
    assert operator.active(ov(kill=True), HOUR_MS - 1)
    assert not operator.active(ov(kill=True), HOUR_MS)
    assert operator.apply(ov(kill=True), HOUR_MS, RMA, SBM, None) is None
    assert operator.apply(ov(action="clear"), 10, RMA, SBM, None) is None
    assert operator.apply(None, 10, RMA, SBM, None) is None


def test_describe_says_what_until_when_by_whom_and_why() -> None:
    line = operator.describe(ov(max_extra=8, max_coverage=0.25, by="alice"))
    assert line == "eu1: max_extra=8 max_coverage=0.25 until 3600000 by alice: incident"


# -- the contract ----------------------------------------------------------------------------------


def _wire(**changes: object) -> bytes:
    obj = msgspec.to_builtins(ov(kill=True))
    obj.update(changes)
    return json.dumps({k: v for k, v in obj.items() if v is not None}).encode()


@pytest.mark.parametrize("field", ["reason", "ttl_ms"])
def test_an_override_without_reason_or_ttl_is_refused_naming_the_field(field: str) -> None:
    obj = json.loads(_wire())
    del obj[field]
    with pytest.raises(ContractError, match=f"missing required field `{field}`"):
        decode(OperatorOverride, json.dumps(obj))


def test_a_blank_reason_or_a_set_that_does_nothing_is_refused() -> None:
    with pytest.raises(ContractError, match="`reason` is blank"):
        decode(OperatorOverride, _wire(reason="  "))
    with pytest.raises(ContractError, match="needs one of `kill`"):
        decode(OperatorOverride, _wire(kill=False))
    with pytest.raises(ContractError, match=r"\$.ttl_ms"):
        decode(OperatorOverride, _wire(ttl_ms=0))


def test_a_v2_reader_refuses_operator_targets_and_reads_every_other_target() -> None:
    """The v3 promise: old readers keep reading what they read, and fail safe on the rest."""
    c = granted()
    _, period = run(c, 0, 3)
    killed = c.on_override(ov(issued_at_ms=3 * PERIOD_MS, kill=True), 3 * PERIOD_MS)
    assert period.v == 2 and killed is not None and killed.v == OPERATOR_VERSION
    versions_a_v2_reader_accepts = {1, 2}
    assert period.v in versions_a_v2_reader_accepts
    assert killed.v not in versions_a_v2_reader_accepts  # refused: baseline only on that side
    assert decode(ControlTargets, encode(killed)) == killed  # a v3 reader takes it


# -- the controller -----------------------------------------------------------------------------


def test_kill_publishes_baseline_only_at_once_and_holds_it_every_period() -> None:
    c = granted()
    t, before = run(c, 0, 4)
    assert before.rma.extra_candidates > 0 and before.sbm.coverage > 0
    killed = c.on_override(ov(issued_at_ms=t, kill=True), t)
    assert killed is not None and killed.reason == "operator" and killed.epoch > before.epoch
    assert (killed.rma.extra_candidates, killed.rma.budget_units_per_s,
            killed.sbm.coverage) == (0, 0.0, 0.0)
    _, later = run(c, t, 2)
    assert later.reason == "operator" and later.rma.extra_candidates == 0
    assert later.rma.limited_by == later.sbm.limited_by == "operator"


def test_a_cap_waits_for_the_next_period() -> None:
    c = granted()
    t, before = run(c, 0, 6)
    assert before.rma.extra_candidates > 2
    assert c.on_override(ov(issued_at_ms=t, max_extra=2), t) is None
    _, capped = run(c, t, 1)
    assert capped.reason == "operator" and capped.rma.extra_candidates == 2
    assert capped.rma.limited_by == "operator"


def test_after_a_clear_or_the_ttl_one_period_is_held_to_the_override_then_the_loop_resumes(
) -> None:
    for lift in ("clear", "ttl"):
        c = granted()
        t, _ = run(c, 0, 4)
        c.on_override(ov(issued_at_ms=t, kill=True, ttl_ms=3 * PERIOD_MS), t)
        t, killed = run(c, t, 1)
        if lift == "clear":
            c.on_override(ov(issued_at_ms=t, action="clear"), t)
            t, first = run(c, t, 1)
        else:
            t, _ = run(c, t, 1)
            t, first = run(c, t, 1)  # the third period: the TTL has run out
        assert killed.reason == "operator" and first.reason == "period", lift
        assert first.rma.extra_candidates == 0 and first.sbm.coverage == 0.0, lift
        _, second = run(c, t, 3)
        assert second.rma.extra_candidates > 0 and second.reason == "period", lift


def test_the_override_survives_a_restart_of_the_controller() -> None:
    c = granted()
    t, _ = run(c, 0, 3)
    c.on_override(ov(issued_at_ms=t, max_extra=1), t)
    restored = ScopeController("eu1", CONFIG, decode_state(encode_state(c.snapshot())))
    assert restored.override == c.override
    _, targets = run(restored, t, 3)
    assert targets.reason == "operator" and targets.rma.extra_candidates <= 1


def test_an_override_reaches_the_controller_through_the_rulebook_and_scope_is_checked() -> None:
    c = granted()
    run(c, 0, 2)
    targets = dispatch(RULES["overrides"], "eu1", ov(issued_at_ms=2 * PERIOD_MS, kill=True),
                       lambda scope: c, 2 * PERIOD_MS)
    assert targets is not None and targets.reason == "operator"
    with pytest.raises(ScopeMismatch):
        c.on_override(ov(scope="us1", kill=True), 0)


def test_same_overrides_give_byte_identical_targets() -> None:
    def trace() -> list[bytes]:
        c = granted()
        out = []
        t, first = run(c, 0, 3)
        out.append(encode(first))
        killed = c.on_override(ov(issued_at_ms=t, kill=True, ttl_ms=2 * PERIOD_MS), t)
        assert killed is not None
        out.append(encode(killed))
        for _ in range(4):
            t, targets = run(c, t, 1)
            out.append(encode(targets))
        return out

    assert trace() == trace()


def test_freeze_holds_the_targets_while_the_loop_would_move_and_a_preemption_still_cuts() -> None:
    c = granted()
    t, held = run(c, 0, 3)
    c.on_override(ov(issued_at_ms=t, freeze=True), t)
    t, frozen = run(c, t, 3)  # the loop alone would keep climbing here
    assert (frozen.reason, frozen.rma.extra_candidates, frozen.sbm.coverage) == (
        "operator", held.rma.extra_candidates, held.sbm.coverage)
    cut = fast_path(c, notice(POWERFUL_POOL, ts_ms=t), t)
    assert cut.sbm.coverage == 0.0
    _, after = run(c, t, 1)
    assert after.reason == "operator" and after.sbm.coverage == 0.0  # holds the cut


def test_a_preemption_under_a_cap_never_raises_past_it() -> None:
    c = granted()
    t, _ = run(c, 0, 6)
    c.on_override(ov(issued_at_ms=t, max_extra=2), t)
    t, capped = run(c, t, 1)
    fast = fast_path(c, notice(RANK_POOL, ts_ms=t, replicas=("w1",)), t)
    assert fast.rma.extra_candidates <= capped.rma.extra_candidates <= 2
