"""docker-compose.yml stays a valid compose project whose commands the CLI accepts.

There is no Docker engine everywhere the tests run, so validity is checked by the compose
tool where it exists and otherwise by the compose-spec loader it is built on
(`infra/compose-check`, Go); the commands are checked against the CLI itself.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from surplus.cli import app

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def _compose_tool() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True,
                                 timeout=30).returncode == 0:
        return [docker, "compose", "-f", str(COMPOSE), "config", "-q"]
    go = shutil.which("go")
    if go:
        return [go, "run", ".", str(COMPOSE)]
    return None


@pytest.mark.slow
def test_compose_file_is_a_valid_compose_project() -> None:
    tool = _compose_tool()
    if tool is None:
        pytest.skip("no compose tool and no Go toolchain here to load the compose file with")
    done = subprocess.run(tool, cwd=ROOT / "infra" / "compose-check", capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def _surplus_commands() -> list[tuple[str, list[str]]]:
    """Each service's `surplus ...` argument list (also inside an `sh -c` line)."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    found = []
    for name, service in services.items():
        command = service.get("command") or []
        if command[:2] == ["sh", "-c"]:
            tail = command[2].split("exec surplus ", 1)
            command = ["surplus", *tail[1].split()] if len(tail) == 2 else []
        if command[:1] == ["surplus"]:
            found.append((name, command[1:]))
    return found


def test_compose_runs_the_surplus_commands_it_should() -> None:
    names = {name for name, _ in _surplus_commands()}
    assert {"topics", "control-plane", "worker-baseline", "worker-opportunistic",
            "worker-powerful", "scheduler", "loadgen"} <= names


@pytest.mark.parametrize("service, args", _surplus_commands(), ids=lambda v: str(v)[:30])
def test_every_flag_in_compose_is_one_the_cli_accepts(service: str, args: list[str]) -> None:
    words = [a for a in args if not a.startswith("-")]
    sub = words[:2] if words[:1] in (["kafka"], ["topics"]) else words[:1]
    helped = CliRunner().invoke(app, [*sub, "--help"], terminal_width=200)
    assert helped.exit_code == 0, helped.output
    for flag in (a for a in args if a.startswith("--")):
        assert re.search(rf"{re.escape(flag)}\b", helped.output), (service, flag)


def test_the_control_plane_is_healthy_when_ready_on_its_metrics_port_and_the_scheduler_waits(
        ) -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    control = services["control-plane"]
    port = re.search(r"--metrics-port (\d+)", control["command"][2])
    assert port is not None
    probe = " ".join(control["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port.group(1)}/readyz" in probe
    waits = services["scheduler"]["depends_on"]
    assert waits["control-plane"] == {"condition": "service_healthy"}
    assert waits["topics"] == {"condition": "service_completed_successfully"}
