"""`surplus chaos --config`: strict, and a bad key is named."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from surplus.chaos.config import ChaosConfig, parse
from surplus.cli import app


def test_a_config_file_sets_load_limits_and_schedule() -> None:
    config = parse("rate_rps = 20\nsla_p99_ms = 80\n[schedule]\nmean_gap_s = 3\n"
                   "weights = {forge = 0}\n[schedule.holds.net_cut]\nmin_s = 1\nmax_s = 2\n")
    assert config.rate_rps == 20 and config.sla_p99_ms == 80
    assert config.schedule.mean_gap_s == 3 and config.schedule.weight("forge") == 0
    assert config.schedule.hold("net_cut").max_s == 2
    assert parse("") == ChaosConfig()


@pytest.mark.parametrize(("text", "names"), [
    ("rate = 20", "rate"),
    ("label_share = 2", "label_share"),
    ("[schedule]\nmean_gap = 3", "mean_gap"),
    ("[schedule]\nweights = {nuke = 1}", "nuke"),
    ("[schedule.holds.net_cut]\nmin_s = 1\nmax = 2", "max"),
    ("rate_rps = 'fast'", "rate_rps"),
    ("rate_rps = ", "chaos.toml"),
])
def test_a_bad_key_stops_naming_it(text: str, names: str) -> None:
    with pytest.raises(ValueError, match=names):
        parse(text, "chaos.toml")


def test_the_command_refuses_a_bad_config_and_plans_a_seed(tmp_path: Path) -> None:
    bad = tmp_path / "chaos.toml"
    bad.write_text("[schedule]\nwarmup = 5\n")
    runner = CliRunner()
    result = runner.invoke(app, ["chaos", "--config", str(bad), "--plan"])
    assert result.exit_code != 0 and "warmup" in result.output
    result = runner.invoke(app, ["chaos", "--seed", "4", "--duration", "300", "--plan"])
    assert result.exit_code == 0, result.output
    assert "faults by kind" in result.output
    again = runner.invoke(app, ["chaos", "--seed", "4", "--duration", "300", "--plan"])
    assert again.output == result.output
    short = runner.invoke(app, ["chaos", "--duration", "20", "--plan"])
    assert short.exit_code != 0 and "--duration" in short.output
