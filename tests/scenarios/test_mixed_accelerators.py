"""Lent units of two accelerator types, the fast ones reclaimed (``mixed_accelerators``):
priced by type, the plan follows the units that are left; priced as one average unit, it plans
the slow ones at the fast ones' pace until the evidence decays, and the baseline pays."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.run import compare
from sim.scenario import find_scenario


def _surplus(scenario: Path, out: Path) -> dict[str, Any]:
    table: dict[str, Any] = compare(scenario, ("surplus",), out, jobs=1)["table"]["surplus"]
    return table


def test_units_priced_by_type_keep_the_baseline_safe_where_an_average_does_not(
        tmp_path: Path) -> None:
    shipped = find_scenario("mixed_accelerators")
    average = tmp_path / "mixed_accelerators_average.toml"
    off = "[control.cost]\nper_accelerator = false\n\n[control.rma]\n"
    average.write_text(shipped.read_text().replace("[control.rma]\n", off, 1))
    typed = _surplus(shipped, tmp_path / "typed")
    pooled = _surplus(average, tmp_path / "average")
    assert typed["baseline_sla_violation_windows"] == 0, typed
    assert typed["baseline_requests_rejected"] == 0, typed
    assert pooled["baseline_sla_violation_windows"] > 0, pooled  # the scenario has work to do
    assert typed["incremental_value"] > pooled["incremental_value"], (typed, pooled)
