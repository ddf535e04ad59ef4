"""best-static: the grid it sweeps, the run it keeps, and the ratio surplus is judged by."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sim.best_static import Grid, choose_best, parse_grid, ratio, resolve_grid, sweep
from tests.unit.sim.helpers import LENT, lent_scenario

POWERFUL = """
[[regions.pools]]
model = "powerful"
tier = "opportunistic"
[regions.pools.capacity]
replicas = 1
[control.sbm]
sla_p99_ms = 60.0
"""


def _run(extra: int, coverage: float, value: float, violations: int = 0,
         rejected: int = 0) -> dict[str, Any]:
    return {"extra_candidates": extra, "coverage": coverage, "incremental_value": value,
            "baseline_sla_violation_windows": violations, "baseline_requests_rejected": rejected}


def test_the_most_valuable_safe_run_wins() -> None:
    sweep_table = [_run(0, 0.0, 0.0), _run(8, 0.1, 50.0), _run(16, 0.1, 80.0),
                   _run(32, 0.2, 200.0, violations=1), _run(32, 0.1, 150.0, rejected=3)]
    assert choose_best(sweep_table) == _run(16, 0.1, 80.0)


def test_a_tie_goes_to_less_optional_work() -> None:
    table = [_run(16, 0.2, 80.0), _run(16, 0.1, 80.0), _run(32, 0.0, 80.0), _run(0, 0.0, 0.0)]
    assert choose_best(table) == _run(16, 0.1, 80.0)


def test_without_a_safe_run_the_zero_setting_is_kept() -> None:
    table = [_run(8, 0.1, 50.0, violations=2), _run(0, 0.0, 0.0, violations=1)]
    assert choose_best(table) == _run(0, 0.0, 0.0, violations=1)
    with pytest.raises(ValueError, match="no sweep run qualifies"):
        choose_best(table[:1])


def test_value_vs_best_static_is_null_when_best_static_earned_nothing() -> None:
    assert ratio(150.0, 100.0) == 1.5
    assert ratio(0.0, 100.0) == 0.0
    assert ratio(10.0, 0.0) is None


def test_grid_from_the_command_line() -> None:
    assert parse_grid("extra=0,8,16 coverage=0,0.25") == {
        "extra_candidates": [0, 8, 16], "coverage": [0.0, 0.25]}
    assert parse_grid("budget=500") == {"budget_units_per_s": 500.0}
    for bad in ("extra", "depth=3", "extra=a,b"):
        with pytest.raises(ValueError, match="--static-grid"):
            parse_grid(bad)


def test_grid_defaults_follow_the_control_limits_and_the_scenario_overrides_them(
        tmp_path: Path) -> None:
    sc, _ = lent_scenario(tmp_path)
    grid = resolve_grid(sc)
    max_extra, max_cov = sc.control.rma.max_extra_candidates, sc.control.sbm.max_coverage
    assert grid.extra_candidates[0] == 0 and grid.extra_candidates[-1] == max_extra
    assert grid.coverage == (0.0,)  # no powerful-model pool: coverage changes nothing
    sc, _ = lent_scenario(tmp_path, LENT + POWERFUL)
    grid = resolve_grid(sc)
    assert grid.coverage == (0.0, max_cov / 4, max_cov / 2, max_cov)
    assert len(grid.points()) == len(grid.extra_candidates) * len(grid.coverage)
    sc, _ = lent_scenario(tmp_path, LENT + "[controllers.best_static]\n"
                                           "extra_candidates = [4, 2]\ncoverage = [0.1]\n")
    grid = resolve_grid(sc)
    assert (grid.extra_candidates, grid.coverage) == ((2, 4), (0.1,))
    assert grid.points() == [(0, 0.0), (2, 0.1), (4, 0.1)]
    assert resolve_grid(sc, {"coverage": [0.0]}).points() == [(0, 0.0), (2, 0.0), (4, 0.0)]
    with pytest.raises(ValueError, match="coverage"):
        resolve_grid(sc, {"coverage": [1.5]})


def test_sweep_keeps_the_best_safe_run_and_the_pool_changes_nothing(tmp_path: Path) -> None:
    sc, base = lent_scenario(tmp_path, LENT.replace("duration_s = 60.0", "duration_s = 20.0"))
    grid = Grid(extra_candidates=(0, 20), coverage=(0.0,), budget_units_per_s=1e9)
    one = sweep(sc, base, tmp_path / "one", grid, jobs=1)
    assert sweep(sc, base, tmp_path / "two", grid, jobs=2) == one
    assert (tmp_path / "one" / "summary.json").read_bytes() == \
        (tmp_path / "two" / "summary.json").read_bytes()
    table = one["best_static"]["sweep"]
    assert [(r["extra_candidates"], r["coverage"]) for r in table] == [(0, 0.0), (20, 0.0)]
    chosen = one["best_static"]["chosen"]
    assert chosen == choose_best(table) and one["controller"] == "best-static"
    assert one["static_setting"]["extra_candidates"] == chosen["extra_candidates"]
    assert one["incremental_value"] == chosen["incremental_value"]
    for name in ("timeline.csv", "events.jsonl.zst"):
        assert (tmp_path / "one" / name).read_bytes() == (
            tmp_path / "one" / "sweep" / f"extra{chosen['extra_candidates']}_coverage0"
            / name).read_bytes()
    assert json.loads((tmp_path / "one" / "summary.json").read_text())["best_static"][
        "grid"] == grid.as_dict()
