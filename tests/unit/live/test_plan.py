"""A scenario read as a live fleet: a stretched timeline, one process per replica ever lent,
phases, the control table, and opportunistic replicas that run only while lent."""

from __future__ import annotations

from pathlib import Path

import msgspec

from sim import schedule
from surplus.live import plan
from tests.unit.sim.helpers import lent_scenario


def test_stretch_scales_the_story_not_the_notices(tmp_path: Path) -> None:
    scenario, _ = lent_scenario(tmp_path)
    half = plan.stretch(scenario, 30.0)
    assert half.duration_s == 30.0
    assert (half.storms[0].at_s, half.storms[0].return_after_s, half.storms[0].notice_s) == (
        20.0, 5.0, 1.0)
    cap = half.regions[0].pools[1].capacity
    assert cap is not None and cap.steps == [(2.5, 3), (15.0, 1)]
    assert half.regions[0].pools[1].grant_every_s == 4.0


def test_a_live_run_starts_one_process_per_replica_ever_lent(tmp_path: Path) -> None:
    scenario, _ = lent_scenario(tmp_path)
    ids = [r.worker_id for r in plan.replicas(scenario.regions[0])]
    assert ids == ["eu1-baseline-l4-baseline-0", "eu1-baseline-cpu-opportunistic-0",
                   "eu1-baseline-cpu-opportunistic-1", "eu1-baseline-cpu-opportunistic-2"]


def test_phases_follow_the_first_grant_and_the_storm(tmp_path: Path) -> None:
    scenario, base = lent_scenario(tmp_path)
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
    scenario, base = lent_scenario(tmp_path)
    changes = plan.replica_changes(schedule.build(scenario, base),
                                   plan.replicas(scenario.regions[0]))
    rep = "eu1-baseline-cpu-opportunistic-"
    assert [(c.at_ms, c.worker_id[len(rep):], c.up) for c in changes] == [
        (5000, "0", True), (5000, "1", True), (5000, "2", True),   # the first grant
        (32_000, "1", False), (32_000, "2", False),                # the step down's deadline
        (41_000, "0", False),                                      # the storm's deadline
        (50_000, "0", True)]                                       # capacity back
    assert plan.managed_replicas(changes) == {rep + "0", rep + "1", rep + "2"}


def test_a_replica_lent_again_before_its_deadline_restarts_after_it() -> None:
    pool = "eu1/rank/baseline/cpu/opportunistic"
    replica = plan.Replica(worker_id="r0", region="eu1", service="rank", model="baseline",
                           tier="opportunistic", accelerator="cpu", pool_id=pool)

    def act(at_ms: int, kind: schedule.Kind, n: int, notice_ms: int = 0) -> schedule.Action:
        return schedule.Action(at_ms=at_ms, kind=kind, region="eu1", pool_id=pool,
                               accelerator="cpu", replicas=n, cpu_per_replica=1.0,
                               notice_ms=notice_ms)

    actions = [act(0, "grant", 1), act(1000, "notice", 1, notice_ms=3000), act(2000, "grant", 1)]
    changes = plan.replica_changes(actions, [replica])
    assert [(c.at_ms, c.up) for c in changes] == [(0, True), (4000, False), (4000, True)]
