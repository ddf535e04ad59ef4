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
