from __future__ import annotations

from pathlib import Path

import pytest

from streams.control.config import ConfigError, ControlConfig, load_config, with_overrides


def test_defaults_are_consistent() -> None:
    cfg = ControlConfig()
    assert cfg.period_s == 10.0 and cfg.ttl_ms == 30_000
    assert cfg.rma.pid().setpoint == pytest.approx(cfg.rma.sla_p99_ms * cfg.rma.margin)
    assert cfg.rma.pid().out_max == cfg.rma.max_extra_candidates


def test_toml_file_overrides_only_what_it_names(tmp_path: Path) -> None:
    path = tmp_path / "control.toml"
    path.write_text('period_s = 5.0\n[rma]\nkp = 0.25\n[allocator]\n'
                    'powerful_model_accelerators = ["h100"]\n'
                    'sbm_value_segments = [[2.0, 3.0], [8.0, 1.0]]\n')
    cfg = load_config(path)
    assert cfg.period_s == 5.0 and cfg.rma.kp == 0.25
    assert cfg.rma.ki == ControlConfig().rma.ki
    assert cfg.allocator.powerful_model_accelerators == ("h100",)
    assert cfg.allocator.sbm_value_segments == ((2.0, 3.0), (8.0, 1.0))


def test_unknown_key_in_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "control.toml"
    path.write_text("[rma]\nkpp = 0.25\n")
    with pytest.raises(ConfigError, match="kpp"):
        load_config(path)


def test_out_of_range_value_in_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "control.toml"
    path.write_text("[rma]\nmargin = 1.2\n")
    with pytest.raises(ConfigError, match=r"rma\.margin"):
        load_config(path)


def test_overrides_take_dotted_keys_and_command_line_strings() -> None:
    cfg = with_overrides(ControlConfig(), {"rma.kp": "0.5", "sbm.max_coverage": 0.3,
                                           "allocator.powerful_model_accelerators": "a100,h200"})
    assert cfg.rma.kp == 0.5 and cfg.sbm.max_coverage == 0.3
    assert cfg.allocator.powerful_model_accelerators == ("a100", "h200")


def test_bad_override_key_is_named() -> None:
    with pytest.raises(ConfigError, match=r"'rma\.kq'"):
        with_overrides(ControlConfig(), {"rma.kq": 1.0})
    with pytest.raises(ConfigError, match=r"'nope\.kp'"):
        with_overrides(ControlConfig(), {"nope.kp": 1.0})


def test_bad_override_value_is_named() -> None:
    with pytest.raises(ConfigError, match=r"sbm\.max_coverage"):
        with_overrides(ControlConfig(), {"sbm.max_coverage": 2.0})


SCOPED = """
period_s = 10.0
ttl_s = 30.0
[rma]
kp = 0.1
[scopes.eu1]
period_s = 5.0
[scopes.eu1.rma]
sla_p99_ms = 80.0
[scopes.us-east]
ttl_s = 12.0
"""


def test_a_scope_table_overrides_only_its_keys_for_that_scope(tmp_path: Path) -> None:
    path = tmp_path / "control.toml"
    path.write_text(SCOPED)
    cfg = load_config(path)
    eu1 = cfg.for_scope("eu1")
    assert (eu1.period_s, eu1.rma.sla_p99_ms, eu1.ttl_s) == (5.0, 80.0, 30.0)
    assert eu1.rma.kp == 0.1  # the file's base keys still apply to the scope
    assert eu1.scopes == {}
    assert cfg.for_scope("us-east").ttl_s == 12.0 and cfg.for_scope("us-east").period_s == 10.0
    other = cfg.for_scope("ap1")
    assert (other.period_s, other.ttl_s, other.rma.sla_p99_ms) == (10.0, 30.0, 100.0)
    assert cfg.periods_ms() == (5_000, 10_000)


def test_base_overrides_reach_scopes_that_do_not_set_the_key() -> None:
    cfg = ControlConfig(scopes={"eu1": {"rma": {"sla_p99_ms": 80.0}}})
    tuned = with_overrides(cfg, {"rma.kp": "0.3"})
    assert tuned.for_scope("eu1").rma.kp == 0.3 and tuned.for_scope("eu1").rma.sla_p99_ms == 80.0


def test_a_config_without_scope_tables_is_what_every_scope_runs() -> None:
    cfg = ControlConfig(period_s=2.0)
    assert cfg.for_scope("eu1") is cfg and cfg.periods_ms() == (2_000,)


@pytest.mark.parametrize(("table", "named"), [
    ("[scopes.eu1.rma]\nkq = 1.0\n", r"'scopes\.eu1\.rma\.kq'"),
    ("[scopes.eu1]\nperiod_s = -1.0\n", r"scopes\.eu1\.period_s"),
    ("[scopes.eu1.rma]\nmargin = 1.5\n", r"scopes\.eu1\.rma\.margin"),
    ("[scopes.eu1]\nperiod_s = \"5\"\n", r"scopes\.eu1\.period_s"),
    ("[scopes.eu1]\nrma = 3\n", r"scopes\.eu1\.rma: expected a table"),
    ("[scopes.eu1.scopes.us1]\nttl_s = 1.0\n", r"'scopes\.eu1\.scopes'"),
    ("[scopes.\"eu.1\"]\nttl_s = 1.0\n", r"scope name 'eu\.1'"),
    ("scopes = 3\n", r"scopes: expected \[scopes\.<region>\] tables"),
])
def test_a_bad_scope_override_stops_loading_naming_the_key(
        tmp_path: Path, table: str, named: str) -> None:
    path = tmp_path / "control.toml"
    path.write_text(table)
    with pytest.raises(ConfigError, match=named):
        load_config(path)
