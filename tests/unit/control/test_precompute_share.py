"""The precompute lever's share in the targets (``streams.control.precompute_share``): set
only where lent replicas run the lever, cut to a probe where answers are measured to hurt,
and read why it is not higher from what the lent pools use."""

from __future__ import annotations

import msgspec
import pytest

from schemas.codec import decode, encode
from schemas.contract import ControlTargets, OperatorOverride, PrecomputeTarget
from streams.control.config import ControlConfig, PrecomputeShareConfig
from streams.control.controller import ScopeController, decode_state, encode_state
from streams.control.moments import Estimate
from streams.control.precompute_share import PrecomputeSharePolicy
from streams.control.windows import WindowSet, WindowStats
from tests.unit.control.factories import POWERFUL_POOL, RANK_BASE_POOL, RANK_POOL, report

UNMEASURED = Estimate()


def lent(pool: str = RANK_POOL, *, share: float | None, utilisation: float = 0.2,
         start_ms: int = 0, worker: str = "w1") -> object:
    base = report(pool, worker=worker, utilisation=utilisation, start_ms=start_ms,
                  end_ms=start_ms + 1000)
    return base if share is None else msgspec.structs.replace(
        base, v=13, precompute_utilisation=share)


def windows(*reports: object) -> list[WindowStats]:
    ws = WindowSet(min_samples=1, opened_ms=0)
    for r in reports:
        ws.add(r)  # type: ignore[arg-type]
    return ws.close(1_000)


def test_no_share_is_set_until_a_lent_replica_reports_the_lever() -> None:
    policy = PrecomputeSharePolicy(PrecomputeShareConfig())
    assert policy.step(windows(lent(share=None), lent(RANK_BASE_POOL, share=None)),
                       UNMEASURED) is None
    target = policy.step(windows(lent(share=0.6)), UNMEASURED)
    assert target == PrecomputeTarget(share=0.8, limited_by="max")   # 0.2 + 0.6 fills 0.8


def test_pools_that_leave_the_share_unused_ran_out_of_jobs_and_reclaimed_ones_have_none(
) -> None:
    policy = PrecomputeSharePolicy(PrecomputeShareConfig())
    assert policy.step(windows(lent(share=0.1), lent(POWERFUL_POOL, share=0.7)),
                       UNMEASURED) == PrecomputeTarget(share=0.8, limited_by="demand")
    assert policy.step(windows(lent(RANK_BASE_POOL, share=None)),
                       UNMEASURED) == PrecomputeTarget(share=0.8, limited_by="capacity")


def test_answers_measured_to_hurt_leave_a_probe_share_and_measured_help_the_maximum() -> None:
    policy = PrecomputeSharePolicy(PrecomputeShareConfig(max_share=0.7, probe_share=0.1))
    hurts = Estimate(measured=-0.05, ci_low=-0.08, ci_high=-0.01, std=0.015)
    assert policy.step(windows(lent(share=0.6)), hurts) == PrecomputeTarget(
        share=0.1, limited_by="demand")
    unsure = Estimate(measured=-0.05, ci_low=-0.1, ci_high=0.01, std=0.03)
    assert policy.step(windows(lent(share=0.6)), unsure) == PrecomputeTarget(share=0.7,
                                                                             limited_by="max")
    assert PrecomputeSharePolicy(policy.config, policy.state).share == 0.7


def _period(c: ScopeController, t0: int, share: float | None) -> ControlTargets:
    for second in range(10):
        start = t0 + second * 1000
        c.on_report(lent(share=share, start_ms=start), start + 1000)  # type: ignore[arg-type]
    return c.tick(t0 + 10_000)


def test_targets_carry_the_share_as_v13_only_where_the_lever_runs_and_survive_a_restart(
) -> None:
    c = ScopeController("eu1", ControlConfig())
    off = _period(c, 0, None)
    assert off.precompute is msgspec.UNSET and off.v < 13
    on = _period(c, 10_000, 0.7)
    assert on.v == 13 and on.precompute == PrecomputeTarget(share=0.8, limited_by="max")
    assert decode(ControlTargets, encode(on)) == on
    with pytest.raises(Exception, match="precompute"):   # a v12 target may not carry it
        decode(ControlTargets, encode(on).replace(b'"v":13', b'"v":12'))
    again = ScopeController("eu1", ControlConfig(), decode_state(encode_state(c.snapshot())))
    assert _period(again, 20_000, None).precompute == PrecomputeTarget(
        share=0.8, limited_by="capacity")


def test_a_kill_gives_the_lever_no_share() -> None:
    c = ScopeController("eu1", ControlConfig())
    _period(c, 0, 0.7)
    kill = OperatorOverride(scope="eu1", action="set", kill=True, issued_at_ms=10_000,
                            ttl_ms=60_000, reason="incident")
    killed = c.on_override(kill, 10_000)
    assert killed is not None
    assert killed.precompute == PrecomputeTarget(share=0.0, limited_by="operator")
    assert _period(c, 10_000, 0.7).precompute == PrecomputeTarget(share=0.0,
                                                                  limited_by="operator")


def test_a_freeze_holds_the_share_last_issued_and_with_none_issued_holds_nothing() -> None:
    def freeze(at_ms: int) -> OperatorOverride:
        return OperatorOverride(scope="eu1", action="set", freeze=True, issued_at_ms=at_ms,
                                ttl_ms=60_000, reason="incident")

    from streams.control import override as operator
    c = ScopeController("eu1", ControlConfig())
    last = _period(c, 0, 0.7)
    loop = PrecomputeTarget(share=0.5, limited_by="demand")
    assert operator.precompute(freeze(10_000), 10_000, loop, last) == PrecomputeTarget(
        share=0.8, limited_by="operator")
    assert operator.precompute(freeze(10_000), 10_000, loop, None) == PrecomputeTarget(
        share=0.0, limited_by="operator")
    assert operator.precompute(freeze(10_000), 10_000, None, last) is None   # lever off
    assert operator.precompute(freeze(0), 100_000, loop, last) == loop       # lapsed
