"""The client's wait for the powerful model, in the simulator as in the live client: an answer
later than ``client.powerful_deadline_share`` of the deadline is given up on, the request falls
back to the ranking pool at the end of the wait, and no SBM value is counted for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.engine import Simulation
from tests.unit.sim.helpers import POWERFUL, lent_scenario


def _run(tmp_path: Path, ms: float) -> dict[str, Any]:
    scenario, base = lent_scenario(tmp_path, POWERFUL.format(ms=ms))
    return Simulation(scenario, base, "static", tmp_path / "out").run()


def test_answers_within_the_wait_are_served_by_the_powerful_model(tmp_path: Path) -> None:
    region = _run(tmp_path, 40.0)["regions"]["eu1"]
    assert region["powerful_served"] > 0 and region["sbm_value"] > 0
    # only those that queued past the wait behind others are given up on
    assert region["powerful_abandoned"] < region["powerful_served"] / 10


def test_answers_past_the_wait_fall_back_at_its_end_and_earn_nothing(tmp_path: Path) -> None:
    summary = _run(tmp_path, 80.0)   # the client waits 60 ms of the 100 ms deadline
    region = summary["regions"]["eu1"]
    assert region["powerful_served"] == 0 and region["sbm_value"] == 0.0
    assert region["powerful_abandoned"] > 0
    assert region["sbm_fallbacks"] >= region["powerful_abandoned"]
    assert region["ranking_served"] == region["requests"]
    # the powerful replicas' answers still count against the deadline they are judged on
    assert region["worst_window_powerful_p99_ms"] >= 80.0
