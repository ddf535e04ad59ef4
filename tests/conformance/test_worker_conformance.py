"""The simulator runs the production worker's rules: one recorded sequence, fed to the live
worker and to the simulated worker, gets the same answer at every step (``cases.py``)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from schemas.contract import (
    CapacityEvent,
    ControlTargets,
    PreemptionNotice,
    RmaTarget,
    SbmTarget,
)
from tests.conformance.cases import (
    CASES,
    REGION,
    T0,
    Capacity,
    Case,
    Notice,
    Rank,
    Report,
    Step,
    Targets,
    Wait,
)
from tests.conformance.sides import Clock, LiveSide, Side, SimSide


def _targets(step: Targets, now: int) -> ControlTargets:
    budget = -1.0 if step.out_of_range else step.budget
    return ControlTargets(scope=step.scope, epoch=step.epoch,
                          issued_at_ms=now - step.issued_ms_ago, ttl_ms=step.ttl_ms,
                          rma=RmaTarget(extra_candidates=step.extra, budget_units_per_s=budget),
                          sbm=SbmTarget(coverage=step.coverage,
                                        extra_candidates=step.powerful_extra),
                          v=2 if step.powerful_extra is None else 5)


def _notice(step: Notice, now: int, pool_id: str) -> PreemptionNotice:
    issued = now - step.issued_ms_ago
    return PreemptionNotice(notice_id=step.notice_id, ts_ms=issued, region=REGION,
                            pool_id=pool_id + "-other" if step.other_pool else pool_id,
                            replicas=list(step.replicas), deadline_ms=now + step.deadline_in_ms)


def _capacity(step: Capacity, now: int, pool_id: str) -> CapacityEvent:
    return CapacityEvent(event_id=f"c{now}", ts_ms=now, region=REGION, pool_id=pool_id,
                         kind=step.kind, accelerator="cpu",  # type: ignore[arg-type]
                         accelerator_units=step.units, expires_at_ms=now + 30_000)


async def _answer(side: Side, step: Step, clock: Clock) -> Any:
    now = clock()
    if isinstance(step, Wait):
        return None
    if isinstance(step, Targets):
        return await side.offer(_targets(step, now))
    if isinstance(step, Notice):
        return await side.notice(_notice(step, now, side.pool_id))
    if isinstance(step, Capacity):
        return await side.capacity(_capacity(step, now, side.pool_id))
    if isinstance(step, Rank):
        return await side.rank(step)
    assert isinstance(step, Report)
    return await side.report()


async def run_case(case: Case) -> list[tuple[Step, Any, Any]]:
    """Every step of ``case`` on both sides: (step, live answer, simulated answer)."""
    clock = Clock(T0)
    live, sim = LiveSide(case, clock), SimSide(case, clock)
    await live.start()
    try:
        answers = []
        for step in case.steps:
            if isinstance(step, Wait):
                clock.now_ms += step.ms
            answers.append((step, await _answer(live, step, clock),
                            await _answer(sim, step, clock)))
        return answers
    finally:
        await live.stop()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_live_and_simulated_worker_answer_every_step_alike(case: Case) -> None:
    for i, (step, live, sim) in enumerate(await run_case(case)):
        assert live == sim, f"step {i} {step}: live {live} != simulated {sim}"


async def test_the_cases_exercise_every_decision_they_are_meant_to() -> None:
    """Guards the cases themselves: a case list that stopped shedding, admitting or refusing
    would still pass the comparison above while proving little."""
    reasons: set[str] = set()
    verdicts: set[str] = set()
    outcomes: set[str] = set()
    admitted = 0
    for case in CASES:
        for step, live, _ in await run_case(case):
            if isinstance(step, Rank):
                reasons |= set(live["shed"])
                admitted += live["optional_done"]
            elif isinstance(step, Targets):
                verdicts.add(live)
            elif isinstance(step, Notice):
                outcomes.add(live)
    assert {"stale_targets", "over_target", "budget", "preemption", "overload"} <= reasons
    assert {"applied", "expired", "wrong_scope", "out_of_range", "duplicate_epoch",
            "issued_before_preemption"} <= verdicts
    assert {"applied", "not_mine", "duplicate", "stale"} <= outcomes
    assert admitted > 0


async def test_a_rule_changed_on_one_side_only_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison can fail: the simulated side alone lets one more extra candidate in."""
    from sim import worker as sim_worker
    from workers.policy.replica import ExtraAllowance, ReplicaPolicy

    real = ReplicaPolicy.allow_extra

    class Drifted(ReplicaPolicy):
        def allow_extra(self, effective: Any, requested: int) -> ExtraAllowance:
            got = real(self, effective, requested)
            return dataclasses.replace(got, allowed=min(requested, got.allowed + 1)) \
                if got.allowed else got

    monkeypatch.setattr(sim_worker, "ReplicaPolicy", Drifted)
    case = next(c for c in CASES if c.name.startswith("valid targets"))
    mismatches = [i for i, (_, live, sim) in enumerate(await run_case(case)) if live != sim]
    assert mismatches
