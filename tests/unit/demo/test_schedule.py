"""The capacity scheduler's script: grants renewed on time, a storm's notice before its revoke,
partial reclaims naming the newest replicas, and nothing left lent at the end."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from schemas.contract import CapacityEvent, PreemptionNotice
from sim.scenario import load_scenario
from surplus.demo import plan, schedule

SCENARIO = """
name = "t"
duration_s = 60.0
[control]
period_s = 2.0
[[regions]]
name = "eu1"
[[regions.segments]]
name = "all"
share = 1.0
[[regions.pools]]
replicas = 1
[[regions.pools]]
tier = "opportunistic"
accelerator = "cpu"
grant_every_s = 4.0
grant_ttl_s = 10.0
cpu_per_replica = 4.0
[regions.pools.capacity]
kind = "steps"
steps = [[5.0, 3], [30.0, 1]]
notice_s = 2.0
[[storms]]
at_s = 40.0
notice_s = 1.0
return_after_s = 10.0
"""


@pytest.fixture
def actions(tmp_path: Path) -> list[schedule.Action]:
    (tmp_path / "s.toml").write_text(SCENARIO)
    scenario, base = load_scenario(tmp_path / "s.toml")
    return schedule.build(scenario, base)


def test_first_grant_lends_every_replica_of_the_step(actions: list[schedule.Action]) -> None:
    first = actions[0]
    assert (first.at_ms, first.kind, first.replicas) == (5000, "grant", 3)
    event = first.event(1_000_000, 1)
    assert isinstance(event, CapacityEvent)
    assert (event.accelerator_units, event.cpu_units, event.expires_at_ms) == (3.0, 12.0,
                                                                               1_010_000)


def test_grants_are_renewed_every_grant_period(actions: list[schedule.Action]) -> None:
    grants = [a.at_ms for a in actions if a.kind == "grant" and a.at_ms < 30_000]
    assert grants == [5000, 9000, 13000, 17000, 21000, 25000, 29000]


def test_a_smaller_step_names_the_newest_replicas_then_renews_smaller(
        actions: list[schedule.Action]) -> None:
    at_30 = [a for a in actions if a.at_ms == 30_000]
    assert [a.kind for a in at_30] == ["notice", "grant"]
    notice, grant = at_30
    assert notice.named == ("eu1-baseline-cpu-opportunistic-1", "eu1-baseline-cpu-opportunistic-2")
    assert (notice.replicas, notice.notice_ms, grant.replicas) == (2, 2000, 1)
    event = notice.event(7_000, 2)
    assert isinstance(event, PreemptionNotice)
    assert (event.deadline_ms, event.accelerator_units, event.cpu_units) == (9_000, 2.0, 8.0)


def test_a_storm_reclaims_the_whole_pool_and_revokes_at_the_deadline(
        actions: list[schedule.Action]) -> None:
    storm = [a for a in actions if 40_000 <= a.at_ms < 50_000]
    assert [(a.at_ms, a.kind) for a in storm] == [(40_000, "notice"), (41_000, "revoke")]
    assert storm[0].named == () and storm[0].notice_ms == 1000
    after = [a for a in actions if a.at_ms >= 50_000]
    assert after[0].at_ms == 50_000 and after[0].kind == "grant" and after[0].replicas == 1


def test_closing_revokes_what_is_still_lent(actions: list[schedule.Action]) -> None:
    closing = schedule.closing_actions(actions, 45_000)
    assert closing == []  # the storm took everything back already
    closing = schedule.closing_actions(actions, 55_000)
    assert [(a.kind, a.pool_id) for a in closing] == [
        ("revoke", "eu1/rank/baseline/cpu/opportunistic")]


def test_stretch_scales_the_story_not_the_notices(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO)
    scenario, _ = load_scenario(tmp_path / "s.toml")
    half = plan.stretch(scenario, 30.0)
    assert half.duration_s == 30.0
    assert (half.storms[0].at_s, half.storms[0].return_after_s, half.storms[0].notice_s) == (
        20.0, 5.0, 1.0)
    cap = half.regions[0].pools[1].capacity
    assert cap is not None and cap.steps == [(2.5, 3), (15.0, 1)]
    assert half.regions[0].pools[1].grant_every_s == 4.0


def test_a_live_run_starts_one_process_per_replica_ever_lent(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO)
    scenario, _ = load_scenario(tmp_path / "s.toml")
    ids = [r.worker_id for r in plan.replicas(scenario.regions[0])]
    assert ids == ["eu1-baseline-l4-baseline-0", "eu1-baseline-cpu-opportunistic-0",
                   "eu1-baseline-cpu-opportunistic-1", "eu1-baseline-cpu-opportunistic-2"]


def test_phases_follow_the_first_grant_and_the_storm(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO)
    scenario, base = load_scenario(tmp_path / "s.toml")
    phases = plan.phases(scenario, schedule.first_grant_s(schedule.build(scenario, base)))
    assert [(p.name, p.start_s, p.end_s) for p in phases] == [
        ("warm-up", 0.0, 5.0), ("harvest", 5.0, 40.0), ("storm", 40.0, 50.0),
        ("recovery", 50.0, 60.0)]
    assert plan.phase_at(phases, 45.0) == "storm"


def test_the_demo_scenario_control_table_round_trips_through_toml(tmp_path: Path) -> None:
    from streams.control.config import load_config

    scenario, _ = plan.load("demo", 90.0)
    (tmp_path / "control.toml").write_text(plan.control_toml(scenario))
    assert load_config(tmp_path / "control.toml") == scenario.control
    assert msgspec.to_builtins(scenario.control)["rma"]["integral_min"] is None


def test_opportunistic_replicas_run_only_while_lent(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO)
    scenario, base = load_scenario(tmp_path / "s.toml")
    changes = schedule.replica_changes(schedule.build(scenario, base),
                                       plan.replicas(scenario.regions[0]))
    rep = "eu1-baseline-cpu-opportunistic-"
    assert [(c.at_ms, c.worker_id[len(rep):], c.up) for c in changes] == [
        (5000, "0", True), (5000, "1", True), (5000, "2", True),   # the first grant
        (32_000, "1", False), (32_000, "2", False),                # the step down's deadline
        (41_000, "0", False),                                      # the storm's deadline
        (50_000, "0", True)]                                       # capacity back
    assert schedule.managed_replicas(changes) == {rep + "0", rep + "1", rep + "2"}


def test_a_replica_lent_again_before_its_deadline_restarts_after_it() -> None:
    pool = "eu1/rank/baseline/cpu/opportunistic"
    replica = plan.Replica(worker_id="r0", region="eu1", service="rank", model="baseline",
                           tier="opportunistic", accelerator="cpu", pool_id=pool)

    def act(at_ms: int, kind: schedule.Kind, n: int, notice_ms: int = 0) -> schedule.Action:
        return schedule.Action(at_ms=at_ms, kind=kind, region="eu1", pool_id=pool,
                               accelerator="cpu", replicas=n, cpu_per_replica=1.0,
                               notice_ms=notice_ms)

    actions = [act(0, "grant", 1), act(1000, "notice", 1, notice_ms=3000), act(2000, "grant", 1)]
    changes = schedule.replica_changes(actions, [replica])
    assert [(c.at_ms, c.up) for c in changes] == [(0, True), (4000, False), (4000, True)]
