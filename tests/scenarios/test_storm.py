"""The preemption storm end to end: baseline untouched, optional work stopped within
milliseconds of the notice, the run deterministic, and its log replaying to the same targets."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from sim.run import simulate
from sim.scenario import find_scenario, load_scenario
from streams.replay import replay_offline

pytestmark = pytest.mark.slow  # one storm run under four controllers: left out of test-fast

STORM = "preemption_storm"


@pytest.fixture
def storm(storm_runs: tuple[Path, dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """The surplus run of the shared storm comparison: its directory and summary."""
    out, summary = storm_runs
    return out / "surplus", summary["runs"]["surplus"]


def _timeline(out: Path) -> list[dict[str, str]]:
    with (out / "timeline.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_storm_costs_only_optional_work(storm: tuple[Path, dict[str, Any]]) -> None:
    _, summary = storm
    scenario, _ = load_scenario(find_scenario(STORM))
    assert summary["baseline_requests_rejected"] == 0
    assert summary["baseline_sla_violation_windows"] == 0
    assert summary["windows"] == scenario.duration_s / scenario.control.period_s
    assert summary["optional_units_done_before_first_notice"] > 0
    assert summary["first_notice_s"] == 150.0
    # workers stop optional work when the notice reaches them, not at a control tick
    assert 0 < summary["max_notice_to_shed_ms"] <= scenario.delays.notice_max_ms
    assert summary["targets_by_reason"]["preemption"] >= 1


def test_no_optional_work_while_the_pool_is_gone(storm: tuple[Path, dict[str, Any]]) -> None:
    out, _ = storm
    rows = _timeline(out)
    gone = [r for r in rows if 160.0 <= float(r["t_s"]) <= 195.0]
    before = [r for r in rows if 20.0 <= float(r["t_s"]) <= 150.0]
    assert gone and all(int(r["optional_units_done"]) == 0 for r in gone)
    assert all(int(r["opportunistic_replicas"]) == 0 for r in gone)
    assert all(int(r["optional_units_done"]) > 0 for r in before)


def test_same_seed_same_bytes_other_seed_other_run(storm: tuple[Path, dict[str, Any]],
                                                   tmp_path: Path) -> None:
    out, summary = storm
    again = simulate(STORM, "surplus", tmp_path / "again")
    assert again == summary
    for name in ("summary.json", "timeline.csv", "events.jsonl.zst"):
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name
    other = simulate(STORM, "surplus", tmp_path / "other", seed=8, duration_s=30.0)
    first = json.loads((out / "summary.json").read_text())
    assert other["requests"] != first["requests"]


def test_replaying_the_simulation_log_reproduces_its_targets(
        storm: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, _ = storm
    scenario, _ = load_scenario(find_scenario(STORM))
    replay_offline(out / "events.jsonl.zst", scenario.control, tmp_path / "replay")
    keys = ("ts_ms", "scope", "epoch", "reason", "extra_candidates", "budget_units_per_s",
            "coverage", "segments")
    with (tmp_path / "replay" / "targets.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    recorded = [tuple(r[k] for k in keys) for r in rows if r["source"] == "recorded"]
    replayed = [tuple(r[k] for k in keys) for r in rows if r["source"] == "replay"]
    assert recorded and replayed == recorded


def test_a_zero_notice_storm_is_shed_as_soon_as_the_notice_arrives(tmp_path: Path) -> None:
    """A reclaim without notice (a hardware failure, Kafka lag past the deadline): the
    replicas still stop their optional work when the notice reaches them, and the summary
    says how fast."""
    text = (Path(find_scenario(STORM))).read_text()
    assert "notice_s = 1.0" in text
    scenario = tmp_path / "zero_notice_storm.toml"
    scenario.write_text(text.replace("notice_s = 1.0", "notice_s = 0.0"))
    summary = simulate(scenario, "surplus", tmp_path / "run", duration_s=170.0)
    loaded, _ = load_scenario(scenario)
    assert summary["first_notice_s"] == 150.0
    assert 0 < summary["max_notice_to_shed_ms"] <= loaded.delays.notice_max_ms
    assert summary["baseline_requests_rejected"] == 0
    assert summary["baseline_sla_violation_windows"] == 0
