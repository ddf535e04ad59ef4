"""Golden summaries of the shipped scenarios, and what they must show.

Every shipped scenario is run here with all four controllers for a short stretch (``FAST``)
and compared with its golden table; the full-length goldens (``*_full.json``, written by
``surplus simulate NAME --compare surplus,naive,static,greedy``) must show what the scenarios
exist to show, and the ``slow`` test re-runs them. Rewrite goldens after a deliberate change
with ``SURPLUS_UPDATE_GOLDENS=1 pytest tests/scenarios`` (add ``-m slow`` for the full ones)
and say why in the commit.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from sim.run import HEADLINE, compare
from sim.scenario import find_scenario, load_scenario

GOLDEN = Path(__file__).parent / "golden"
CONTROLLERS = ("surplus", "naive", "static", "greedy")
FAST = {"preemption_storm": None, "azure_steady": 120.0, "diurnal_day": 1800.0, "burst": 120.0}
UPDATE = os.environ.get("SURPLUS_UPDATE_GOLDENS") == "1"
SLOW_SHORT = {"burst"}  # over 10 s even short: left to `make test`, out of `make test-fast`


def _table(summary: dict[str, Any]) -> dict[str, Any]:
    return {"scenario": summary["scenario"], "seed": summary["seed"],
            "duration_s": summary["duration_s"], "table": summary["table"]}


def _check(path: Path, got: dict[str, Any]) -> None:
    if UPDATE:
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    want = json.loads(path.read_text())
    assert (got["scenario"], got["seed"], got["duration_s"]) == (
        want["scenario"], want["seed"], want["duration_s"])
    diffs = []
    for name in CONTROLLERS:
        for key in HEADLINE:
            a, b = got["table"][name][key], want["table"][name][key]
            same = a == b or (isinstance(a, float) and isinstance(b, float)
                              and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9))
            if not same:
                diffs.append(f"{name}.{key}: got {a}, golden {b}")
    assert not diffs, f"{path.name} differs:\n" + "\n".join(diffs)


def _shows_what_it_should(table: dict[str, dict[str, Any]], deadline_ms: float) -> None:
    """Surplus safe (no SLA window over, and the slowest 1% of requests end within their
    deadline) and better than naive; greedy unsafe: it breaks the baseline SLA, or it drives
    the pools so hard that the slowest 1% end past their deadline."""
    surplus, naive, greedy = table["surplus"], table["naive"], table["greedy"]
    assert surplus["baseline_sla_violation_windows"] == 0
    assert surplus["baseline_requests_rejected"] == 0
    assert surplus["incremental_value"] > naive["incremental_value"]
    assert surplus["e2e_p99_ms"] <= deadline_ms
    assert (greedy["baseline_sla_violation_windows"] > 0
            or greedy["e2e_p99_ms"] > deadline_ms)
    assert table["static"]["incremental_value"] == 0.0


@pytest.mark.slow
def test_storm_matches_its_golden_and_writes_a_report(
        storm_runs: tuple[Path, dict[str, Any]]) -> None:
    out, summary = storm_runs
    _check(GOLDEN / "preemption_storm_full.json", _table(summary))
    page = (out / "report.html").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) >= 5 and all(name in page for name in pngs)


@pytest.mark.parametrize("scenario", [
    pytest.param(s, marks=pytest.mark.slow) if s in SLOW_SHORT else s
    for s in sorted(s for s, d in FAST.items() if d is not None)])
def test_short_run_matches_its_golden(scenario: str, tmp_path: Path) -> None:
    summary = compare(scenario, CONTROLLERS, tmp_path, duration_s=FAST[scenario])
    _check(GOLDEN / f"{scenario}_short.json", _table(summary))


@pytest.mark.parametrize("scenario", sorted(FAST))
def test_full_golden_shows_surplus_safe_and_better_and_greedy_unsafe(scenario: str) -> None:
    golden = json.loads((GOLDEN / f"{scenario}_full.json").read_text())
    assert set(golden["table"]) == set(CONTROLLERS)
    loaded, _ = load_scenario(find_scenario(scenario))
    _shows_what_it_should(golden["table"], min(r.deadline_ms for r in loaded.regions))


@pytest.mark.slow
@pytest.mark.timeout(900)  # four controllers over a simulated day: about 5 min on 2 cores
@pytest.mark.parametrize("scenario", sorted(s for s, d in FAST.items() if d is not None))
def test_full_run_matches_its_golden(scenario: str, tmp_path: Path) -> None:
    summary = compare(scenario, CONTROLLERS, tmp_path)
    _check(GOLDEN / f"{scenario}_full.json", _table(summary))
