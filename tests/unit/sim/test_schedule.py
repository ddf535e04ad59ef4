"""The capacity schedule: grants renewed on time, a storm's notice before its revoke, partial
reclaims naming the newest replicas, nothing left lent at the end, the simulator's random
streams untouched, and the simulator publishing exactly the schedule's messages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from schemas.contract import CapacityEvent, PreemptionNotice
from sim import schedule
from sim.engine import Simulation
from streams.eventlog import read_events
from tests.unit.sim.helpers import LENT, lent_scenario

POOL = "eu1/rank/baseline/cpu/opportunistic"


@pytest.fixture
def actions(tmp_path: Path) -> list[schedule.Action]:
    return schedule.build(*lent_scenario(tmp_path))


def test_first_grant_lends_every_replica_of_the_step(actions: list[schedule.Action]) -> None:
    first = actions[0]
    assert (first.at_ms, first.kind, first.replicas) == (5000, "grant", 3)
    event = first.event(1_000_000, 1)
    assert isinstance(event, CapacityEvent)
    assert (event.accelerator_units, event.cpu_units, event.expires_at_ms) == (3.0, 12.0,
                                                                               1_010_000)
    assert event.event_id == f"{POOL}@1000000-1"


def test_grants_are_renewed_every_grant_period(actions: list[schedule.Action]) -> None:
    grants = [a.at_ms for a in actions if a.kind == "grant" and a.at_ms < 30_000]
    assert grants == [5000, 9000, 13000, 17000, 21000, 25000, 29000]


def test_a_smaller_step_names_the_newest_replicas_then_renews_smaller_at_once(
        actions: list[schedule.Action]) -> None:
    at_30 = [a for a in actions if a.at_ms == 30_000]
    assert [a.kind for a in at_30] == ["notice", "grant"]
    notice, grant = at_30
    assert notice.named == ("eu1-baseline-cpu-opportunistic-1", "eu1-baseline-cpu-opportunistic-2")
    assert (notice.replicas, notice.notice_ms, grant.replicas) == (2, 2000, 1)
    assert (notice.lent_after, grant.lent_after) == (None, 1)
    event = notice.event(7_000, 2)
    assert isinstance(event, PreemptionNotice)
    assert (event.deadline_ms, event.accelerator_units, event.cpu_units) == (9_000, 2.0, 8.0)
    assert event.notice_id == f"{POOL}!7000-2"


def test_a_storm_reclaims_the_whole_pool_and_revokes_at_the_deadline(
        actions: list[schedule.Action]) -> None:
    storm = [a for a in actions if 40_000 <= a.at_ms < 50_000]
    assert [(a.at_ms, a.kind) for a in storm] == [(40_000, "notice"), (41_000, "revoke")]
    assert storm[0].named == () and storm[0].notice_ms == 1000
    assert (storm[0].lent_after, storm[1].lent_after) == (0, 0)
    after = [a for a in actions if a.at_ms >= 50_000]
    assert after[0].at_ms == 50_000 and after[0].kind == "grant" and after[0].replicas == 1


@pytest.mark.parametrize(("until_ms", "closing"), [(45_000, []), (55_000, [POOL])])
def test_closing_revokes_what_is_still_lent(actions: list[schedule.Action], until_ms: int,
                                            closing: list[str]) -> None:
    outbox = schedule.Outbox()
    for action in actions:
        if action.at_ms <= until_ms:
            outbox.stamp(action, action.at_ms)
    revokes = outbox.closing(60_000)
    assert [(a.at_ms, a.kind, a.pool_id) for a in revokes] == [(60_000, "revoke", p)
                                                               for p in closing]
    assert outbox.sent == sum(a.at_ms <= until_ms for a in actions)


def test_outages_come_from_the_capacity_stream_the_simulator_leaves_to_the_schedule() -> None:
    child = np.random.SeedSequence(5).spawn(8)[schedule.CAPACITY_STREAM]
    assert (schedule.capacity_rng(5).random(3) == np.random.default_rng(child).random(3)).all()


def test_the_simulator_publishes_exactly_the_schedules_messages(tmp_path: Path) -> None:
    # a notice of 1.25 s puts the storm's revoke inside a step: it still goes out on time
    scenario, base = lent_scenario(tmp_path, LENT.replace("notice_s = 1.0", "notice_s = 1.25"))
    Simulation(scenario, base, "static", tmp_path / "out").run()
    published = [(e.ts, e.topic, e.key, e.value)
                 for e in read_events(tmp_path / "out" / "events.jsonl.zst")
                 if e.topic in ("capacity", "preemption")]
    outbox = schedule.Outbox()
    t0, end = scenario.start_ms, scenario.duration_ms
    sent = [a for a in schedule.build(scenario, base) if a.at_ms < end]
    want = [(t0 + a.at_ms, a.topic, a.region, outbox.stamp(a, t0 + a.at_ms)) for a in sent]
    closing = outbox.closing(end)
    want += [(t0 + end, a.topic, a.region, outbox.stamp(a, t0 + end)) for a in closing]
    assert published == want
    assert (41_250, "revoke") in [(a.at_ms, a.kind) for a in sent]
    assert [a.kind for a in closing] == ["revoke"]


def test_a_pool_may_re_announce_a_reclaim_until_its_deadline(tmp_path: Path) -> None:
    from tests.unit.sim.helpers import LENT

    text = LENT.replace("cpu_per_replica = 4.0", "cpu_per_replica = 4.0\nnotice_repeat_s = 0.25")
    actions = schedule.build(*lent_scenario(tmp_path, text))
    storm = [a for a in actions if 40_000 <= a.at_ms < 50_000]
    assert [(a.at_ms, a.kind) for a in storm] == [
        (40_000, "notice"), (40_250, "notice"), (40_500, "notice"), (40_750, "notice"),
        (41_000, "revoke")]
    assert {a.at_ms + a.notice_ms for a in storm[:4]} == {41_000}  # one deadline
    outbox = schedule.Outbox()
    ids = {outbox.stamp(a, 1_000 + a.at_ms).notice_id for a in storm[:4]}  # type: ignore[union-attr]
    assert len(ids) == 4  # each a notice of its own, for the workers to act on
