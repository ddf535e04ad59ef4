"""Offline replay: the virtual clock, determinism, rejections, and the side-by-side report."""

from __future__ import annotations

import json
from pathlib import Path

from schemas.contract import ControlTargets
from streams.control.config import ControlConfig, with_overrides
from streams.control.controller import ScopeController
from streams.eventlog import make_event
from streams.replay import ControlDriver, compare_offline, replay_offline
from tests.unit.control.factories import RANK_BASE_POOL, REGION, report
from tests.unit.replay.helpers import T0, write_small_log

FILES = ("targets.csv", "windows.csv", "summary.json")


def test_same_log_and_settings_give_byte_identical_outputs(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl.zst"
    write_small_log(log)
    config = ControlConfig(period_s=10.0)
    replay_offline(log, config, tmp_path / "a")
    replay_offline(log, config, tmp_path / "b")
    for name in FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_other_settings_change_the_targets(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    write_small_log(log)
    replay_offline(log, ControlConfig(), tmp_path / "a")
    replay_offline(log, with_overrides(ControlConfig(), {"period_s": "5"}), tmp_path / "b")
    assert ((tmp_path / "a" / "targets.csv").read_bytes()
            != (tmp_path / "b" / "targets.csv").read_bytes())


def test_summary_counts_what_was_read_and_emitted(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    events = write_small_log(log, seconds=60)
    summary = replay_offline(log, ControlConfig(period_s=10.0), tmp_path / "out")
    assert summary["read"]["events"] == len(events)
    assert summary["events_by_topic"] == {"capacity": 2, "outcomes": 60, "preemption": 1,
                                          "targets": 1, "telemetry": 180}
    scope = summary["scopes"][REGION]
    # ticks at T0+10s .. T0+60s (the reports at 60 s close the last period), one fast path
    assert summary["ticks"] == 6
    assert scope["targets_by_reason"] == {"period": 6, "preemption": 1}
    assert scope["recorded_targets"] == 1
    assert scope["ranking_windows"] == 12  # two ranking pools, six ticks
    rows = (tmp_path / "out" / "targets.csv").read_text().splitlines()
    assert len(rows) == 1 + 7 + 1
    assert sum(",recorded," in row for row in rows) == 1


def test_events_at_a_tick_belong_to_the_period_it_closes() -> None:
    config = ControlConfig(period_s=10.0, min_samples=1)
    seen: list[tuple[int, int]] = []
    driver = ControlDriver(config, on_tick=lambda ms, c: seen.append(
        (ms, sum(w.reports for w in c.last_windows))))
    start = T0 - T0 % 10_000
    for s in (1, 5, 10, 11, 20):
        now = start + s * 1000
        driver.feed(make_event(now, "telemetry", REGION, report(
            RANK_BASE_POOL, start_ms=now - 1000, end_ms=now)))
    driver.finish()
    assert seen == [(start + 10_000, 3), (start + 20_000, 2)]


def test_late_events_apply_at_the_last_tick_and_lying_keys_are_rejected() -> None:
    driver = ControlDriver(ControlConfig(period_s=10.0))
    start = T0 - T0 % 10_000
    driver.feed(make_event(start + 1000, "telemetry", REGION, report(RANK_BASE_POOL)))
    driver.feed(make_event(start + 25_000, "telemetry", REGION, report(RANK_BASE_POOL)))
    driver.feed(make_event(start + 3000, "telemetry", REGION, report(RANK_BASE_POOL)))
    driver.feed(make_event(start + 26_000, "telemetry", "us1", report(RANK_BASE_POOL)))
    assert driver.ticks == 2 and driver.late == 1
    assert driver.rejected == {"key_mismatch": 1}
    assert driver.by_topic == {"telemetry": 4}


def test_replay_drives_the_same_controller_as_live(tmp_path: Path) -> None:
    """Feeding the controller by hand in log order gives the replay's targets."""
    log = tmp_path / "log.jsonl"
    events = write_small_log(log, seconds=30)
    config = ControlConfig(period_s=10.0)
    emitted: list[ControlTargets] = []
    ControlDriver(config, on_targets=lambda t, c: emitted.append(t)).run(iter(events))
    controller = ScopeController(REGION, config)
    by_hand: list[ControlTargets] = []
    next_tick = (events[0].ts // 10_000 + 1) * 10_000
    for event in events:
        while event.ts > next_tick:
            by_hand.append(controller.tick(next_tick))
            next_tick += 10_000
        if event.topic == "telemetry":
            controller.on_report(event.value, event.ts)  # type: ignore[arg-type]
        elif event.topic == "capacity":
            controller.on_capacity(event.value, event.ts)  # type: ignore[arg-type]
        elif event.topic == "outcomes":
            controller.on_outcome(event.value, event.ts)  # type: ignore[arg-type]
        elif event.topic == "preemption":
            by_hand.append(controller.on_preemption(event.value, event.ts))  # type: ignore[arg-type]
    by_hand.append(controller.tick(next_tick))
    assert emitted == by_hand


def test_compare_writes_both_runs_side_by_side_with_plots(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    write_small_log(log)
    base = ControlConfig(period_s=10.0)
    summary = compare_offline(log, [("calm", base),
                                    ("eager", with_overrides(base, {"rma.kp": "0.5"}))],
                              tmp_path / "cmp")
    assert summary["labels"] == ["calm", "eager"]
    for label in ("calm", "eager"):
        for name in FILES:
            assert (tmp_path / "cmp" / label / name).is_file()
    written = json.loads((tmp_path / "cmp" / "summary.json").read_text())
    assert set(written["runs"]) == {"calm", "eager"} and set(written["table"]) == {"calm",
                                                                                   "eager"}
    page = (tmp_path / "cmp" / "report.html").read_text()
    pngs = sorted(p.name for p in (tmp_path / "cmp").glob("*.png"))
    assert pngs and all(name in page for name in pngs)
    assert all((tmp_path / "cmp" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in pngs)


def test_a_scope_with_its_own_period_and_ttl_ticks_on_its_own_grid() -> None:
    """``[scopes.us1] period_s = 5`` ticks us1 twice per eu1 tick, each with its own TTL;
    replay builds each controller through ``ControlConfig.for_scope`` as the live agents do."""
    config = ControlConfig(period_s=10.0, min_samples=1,
                           scopes={"us1": {"period_s": 5.0, "ttl_s": 7.0}})
    ticks: list[tuple[str, int, int]] = []
    driver = ControlDriver(config, on_targets=lambda t, c: ticks.append(
        (t.scope, t.issued_at_ms, t.ttl_ms)))
    start = T0 - T0 % 10_000
    for s in range(1, 21):
        now = start + s * 1000
        for scope in (REGION, "us1"):
            pool = RANK_BASE_POOL.replace(REGION, scope)
            driver.feed(make_event(now, "telemetry", scope,
                                   report(pool, start_ms=now - 1000, end_ms=now)))
    driver.finish()
    eu1 = [(at - start, ttl) for scope, at, ttl in ticks if scope == REGION]
    us1 = [(at - start, ttl) for scope, at, ttl in ticks if scope == "us1"]
    assert eu1 == [(10_000, 30_000), (20_000, 30_000)]
    assert us1 == [(5_000, 7_000), (10_000, 7_000), (15_000, 7_000), (20_000, 7_000)]
    assert driver.controllers["us1"].config.period_s == 5.0
