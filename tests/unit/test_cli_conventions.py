"""Every command takes its settings from flags, the environment and a settings file alike
(in that order of precedence), says its version, and stops at start naming a bad key."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from schemas.build import surplus_version
from surplus import logs, settings_file
from surplus.cli import app

GROUP = typer.main.get_group(app)


def _params(path: list[str], default_map: dict[str, Any] | None = None,
            args: tuple[str, ...] = ()) -> dict[str, Any]:
    """The option values `surplus PATH... ARGS` would run with, resolved as Click resolves
    them (flags, then environment, then the settings file's default_map, then defaults)."""
    ctx = GROUP.make_context("surplus", [], resilient_parsing=True)
    ctx.default_map = default_map
    command: Any = GROUP
    for i, name in enumerate(path):
        found = command.get_command(ctx, name)
        assert found is not None, name
        command = found
        last = i == len(path) - 1
        ctx = command.make_context(name, list(args) if last else [], parent=ctx,
                                   resilient_parsing=not last)
    return ctx.params


@pytest.fixture(autouse=True)
def _log_format_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """The root command exports the format for the processes it starts: undo that here."""
    monkeypatch.delenv(logs.ENV, raising=False)


def test_version_prints_the_installed_release() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"surplus {surplus_version()}"


def test_control_plane_options_come_from_its_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SURPLUS_CONTROL_METRICS_PORT", "9101")
    monkeypatch.setenv("SURPLUS_CONTROL_INSTANCE_ID", "control-0")
    params = _params(["control-plane"])
    assert params["metrics_port"] == 9101 and params["instance_id"] == "control-0"


def test_worker_options_come_from_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SURPLUS_WORKER_PORT", "8123")
    monkeypatch.setenv("SURPLUS_WORKER_KAFKA", "false")
    params = _params(["worker"])
    assert params["port"] == 8123 and params["kafka"] is False


def test_other_commands_read_surplus_command_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SURPLUS_SCHEDULER_METRICS_PORT", "9102")
    monkeypatch.setenv("SURPLUS_KAFKA_UP_BROKERS", "3")
    assert _params(["scheduler"])["metrics_port"] == 9102
    assert _params(["kafka", "up"])["brokers"] == 3


def test_kafka_flags_read_the_variables_kafka_settings_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SURPLUS_KAFKA_BOOTSTRAP", "broker:9092")
    assert _params(["control-plane"])["bootstrap"] == "broker:9092"
    assert _params(["worker"])["bootstrap"] == "broker:9092"


def test_flags_win_over_environment_and_environment_over_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "surplus.toml"
    path.write_text('[control-plane]\nmetrics_port = 9200\napp-id = "from-file"\n'
                    'loglevel = "info"\n')
    defaults = settings_file.load(path, GROUP)
    assert _params(["control-plane"], defaults)["metrics_port"] == 9200
    assert _params(["control-plane"], defaults)["app_id"] == "from-file"
    monkeypatch.setenv("SURPLUS_CONTROL_METRICS_PORT", "9300")
    assert _params(["control-plane"], defaults)["metrics_port"] == 9300
    flagged = _params(["control-plane"], defaults, ("--metrics-port", "9400"))
    assert flagged["metrics_port"] == 9400 and flagged["loglevel"] == "info"


def test_a_bad_environment_value_stops_the_control_plane_naming_the_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SURPLUS_CONTROL_METRICS_PORT", "99999")
    result = CliRunner().invoke(app, ["control-plane", "--print-config"])
    assert result.exit_code == 1
    assert "bad control-plane setting metrics_port" in result.output


@pytest.mark.parametrize(("text", "named"), [
    ("[control-plane]\nmetrics_prot = 1\n", "[control-plane] metrics_prot is not an option"),
    ("[control-plain]\nmetrics_port = 1\n", "[control-plain] is not a command"),
    ("[kafka.upp]\nport = 1\n", "[kafka.upp] is not a command"),
    ('log_format = "yaml"\n', "log_format 'yaml'"),
    ("[worker\n", "settings file"),
])
def test_a_bad_settings_file_stops_any_command_naming_the_key(
        tmp_path: Path, text: str, named: str) -> None:
    path = tmp_path / "surplus.toml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["--settings", str(path), "kafka", "status"])
    assert result.exit_code == 1
    assert named in result.output


def test_json_log_format_writes_one_object_per_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(logs.ENV, "json")
    try:
        logs.configure("INFO")
        logging.getLogger("surplus.test").info("hello %s", "world", extra={"scope": "eu1"})
        line = capsys.readouterr().err.strip().splitlines()[-1]
    finally:
        monkeypatch.delenv(logs.ENV)
        logs.configure("WARNING")
    record = json.loads(line)
    assert (record["level"], record["logger"], record["message"]) == (
        "INFO", "surplus.test", "hello world")
    assert record["scope"] == "eu1" and "time" in record


def test_an_unknown_log_format_in_the_environment_is_refused_by_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(logs.ENV, "yaml")
    with pytest.raises(ValueError, match="SURPLUS_LOG_FORMAT='yaml'"):
        logs.current()
