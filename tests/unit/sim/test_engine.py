"""The closed loop (``sim.engine.Simulation``): a run is a function of its scenario and seed,
every controller meets the same requests, and the event log is in time order, holding what
the control plane saw and the targets it answered with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.engine import Simulation
from streams.eventlog import read_events
from tests.unit.sim.helpers import LENT, lent_scenario

#: The lent-capacity scenario with two segments and a powerful pool beside it, so both
#: levers have work.
BOTH = LENT.replace("share = 1.0\n", """share = 0.5
[[regions.segments]]
name = "other"
share = 0.5
""").replace("[control]", """[[regions.pools]]
model = "powerful"
tier = "opportunistic"
accelerator = "a100"
[regions.pools.capacity]
replicas = 1
[controllers.static]
extra_candidates = 20
coverage = 0.3
[control]""") + """[control.sbm]
sla_p99_ms = 55.0
"""


def _run(tmp_path: Path, controller: str, out: str) -> dict[str, Any]:
    scenario, base = lent_scenario(tmp_path, BOTH)
    summary = Simulation(scenario, base, controller, tmp_path / out).run()
    summary.pop("_wall_s")
    return summary


def test_a_run_is_a_function_of_its_scenario_and_seed(tmp_path: Path) -> None:
    first, second = _run(tmp_path, "static", "a"), _run(tmp_path, "static", "b")
    assert first == second
    assert ((tmp_path / "a" / "events.jsonl.zst").read_bytes()
            == (tmp_path / "b" / "events.jsonl.zst").read_bytes())
    assert ((tmp_path / "a" / "timeline.csv").read_bytes()
            == (tmp_path / "b" / "timeline.csv").read_bytes())


def test_every_controller_meets_the_same_arrivals(tmp_path: Path) -> None:
    scenario, base = lent_scenario(tmp_path, BOTH)
    runs = [Simulation(scenario, base, name, tmp_path / name) for name in ("static", "surplus")]
    for sim in runs:
        sim.run()
    static, surplus = (sim.regions["eu1"].arrivals for sim in runs)
    assert (static == surplus).all() and static.sum() > 0


def test_the_log_is_in_time_order_and_holds_every_event_and_target(tmp_path: Path) -> None:
    summary = _run(tmp_path, "surplus", "out")
    events = list(read_events(tmp_path / "out" / "events.jsonl.zst"))
    stamps = [e.ts for e in events if e.topic != "targets"]
    assert stamps == sorted(stamps)
    topics = {e.topic for e in events}
    assert {"telemetry", "capacity", "preemption", "outcomes", "labels", "targets"} <= topics
    targets = sum(e.topic == "targets" for e in events)
    assert targets == sum(summary["targets_by_reason"].values())
    assert summary["events"] == len([e for e in events if e.topic != "estimates"])


def test_every_request_finishes_and_is_published_once(tmp_path: Path) -> None:
    summary = _run(tmp_path, "static", "out")
    outcomes = [e.value for e in read_events(tmp_path / "out" / "events.jsonl.zst")
                if e.topic == "outcomes"]
    ids = [o.request_id for o in outcomes]  # type: ignore[union-attr]
    assert len(ids) == len(set(ids)) == summary["requests"]
    region = summary["regions"]["eu1"]
    assert region["ranking_served"] + region["powerful_served"] == region["requests"]
