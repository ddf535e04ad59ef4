"""`surplus control-plane --print-config`: the laws it would run, per scope, and nothing else."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from streams.control.config import load_config
from surplus.cli import app

runner = CliRunner()


def test_print_config_shows_every_key_and_each_scope_override_and_reads_back(
        tmp_path: Path) -> None:
    path = tmp_path / "control.toml"
    path.write_text("period_s = 4.0\n[scopes.eu1.rma]\nsla_p99_ms = 80.0\n"
                    "[scopes.us1]\nttl_s = 9.0\n")
    # no broker anywhere: printing must not need one
    result = runner.invoke(app, ["control-plane", "--config", str(path), "--print-config",
                                 "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code == 0, result.output
    assert "min_samples = 50" in result.output  # defaults are shown, not only the file's keys
    assert "# eu1: rma.sla_p99_ms = 100.0 -> 80.0" in result.output
    assert "# us1: ttl_s = 30.0 -> 9.0" in result.output
    printed = tmp_path / "printed.toml"
    printed.write_text(result.output)
    assert load_config(printed) == load_config(path)


def test_print_config_refuses_a_bad_scope_key_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "control.toml"
    path.write_text("[scopes.eu1.sbm]\nmax_coverage = 3.0\n")
    result = runner.invoke(app, ["control-plane", "--config", str(path), "--print-config"])
    assert result.exit_code == 1
    assert "scopes.eu1.sbm.max_coverage" in result.output
