"""Scenario files: strict keys that name themselves, consistent clocks, shipped scenarios."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.scenario import SCENARIO_DIR, ScenarioError, find_scenario, load_scenario
from tests.unit.sim.helpers import MINIMAL


def test_minimal_scenario_loads_with_defaults(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(MINIMAL)
    scenario, base = load_scenario(tmp_path / "s.toml", duration_s=5.0, seed=3)
    assert (scenario.duration_s, scenario.seed, base) == (5.0, 3, tmp_path)
    assert scenario.control.period_s == 10.0 and scenario.regions[0].arrivals.kind == "constant"


@pytest.mark.parametrize(("extra", "message"), [
    ("[control.rma]\nkq = 1.0\n", "kq"),
    ("step_ms = 300\n", "step_ms"),
    ("start_ms = 1234\n", "start_ms"),
])
def test_bad_scenarios_name_the_problem(tmp_path: Path, extra: str, message: str) -> None:
    text = MINIMAL.replace('duration_s = 10.0\n', f'duration_s = 10.0\n{extra}', 1) \
        if not extra.startswith("[") else MINIMAL + extra
    (tmp_path / "s.toml").write_text(text)
    with pytest.raises(ScenarioError, match=message):
        load_scenario(tmp_path / "s.toml")


def test_opportunistic_pool_without_capacity_is_refused(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(MINIMAL + '[[regions.pools]]\ntier = "opportunistic"\n'
                                              'accelerator = "a100"\n')
    with pytest.raises(ScenarioError, match="capacity"):
        load_scenario(tmp_path / "s.toml")


def test_a_baseline_pool_with_a_capacity_shape_is_refused(tmp_path: Path) -> None:
    # provisioned replicas are never lent: the schedule lends the opportunistic tier only
    (tmp_path / "s.toml").write_text(MINIMAL + '[regions.pools.capacity]\nreplicas = 2\n')
    with pytest.raises(ScenarioError, match="never lent"):
        load_scenario(tmp_path / "s.toml")


def test_a_region_needs_provisioned_ranking_replicas(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(MINIMAL.replace("replicas = 1", "replicas = 0"))
    with pytest.raises(ScenarioError, match="baseline-tier ranking pool"):
        load_scenario(tmp_path / "s.toml")


def test_shipped_scenarios_load_by_name() -> None:
    names = ("azure_steady", "diurnal_day", "preemption_storm")
    assert set(names) <= {p.stem for p in SCENARIO_DIR.glob("*.toml")}
    for name in names:
        scenario, _ = load_scenario(find_scenario(name))
        assert scenario.name == name
    with pytest.raises(ScenarioError, match="shipped"):
        find_scenario("no_such_scenario")


def test_an_sbm_sla_over_the_clients_wait_for_the_powerful_model_is_refused(
        tmp_path: Path) -> None:
    """The client waits 0.6 of the 100 ms deadline; an SBM SLA of 250 ms would hold the
    powerful replicas where every request it allows has already fallen back."""
    powerful = ('[[regions.pools]]\nmodel = "powerful"\ntier = "opportunistic"\n'
                '[regions.pools.capacity]\nreplicas = 1\n')
    (tmp_path / "s.toml").write_text(MINIMAL + powerful + "[control.sbm]\nsla_p99_ms = 250.0\n")
    with pytest.raises(ScenarioError, match=r"control\.sbm\.sla_p99_ms .*60 ms"):
        load_scenario(tmp_path / "s.toml")
    (tmp_path / "s.toml").write_text(MINIMAL + powerful + "[control.sbm]\nsla_p99_ms = 60.0\n")
    load_scenario(tmp_path / "s.toml")
