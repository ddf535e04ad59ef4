"""docker-compose.yml stays a valid compose project whose commands the CLI accepts.

There is no Docker engine everywhere the tests run, so validity is checked by the compose
tool where it exists and otherwise by the compose-spec loader it is built on
(`infra/compose-check`, Go); the commands are checked against the CLI itself.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
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


def _flag(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_each_opportunistic_worker_has_a_capacity_agent_lending_it_and_no_scheduler_runs(
        ) -> None:
    """A fresh `docker compose up` lends the opportunistic workers with no scheduler: each has
    an agent sharing its network (its /readyz, its /v1/preempt) and its processes (its cgroup
    at /proc/1/root), speaking for its replica id and pool, and the scheduler is opt-in."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    lent = {name: s["command"] for name, s in services.items()
            if "--tier" in (s.get("command") or []) and _flag(s["command"], "--tier")
            == "opportunistic"}
    assert set(lent) == {"worker-opportunistic", "worker-powerful"}
    for name, worker in lent.items():
        (agent,) = [s for s in services.values() if s.get("network_mode") == f"service:{name}"]
        command = agent["command"]
        assert command[:2] == ["surplus", "capacity-agent"] and agent["pid"] == f"service:{name}"
        pool = "/".join(_flag(worker, f) for f in ("--region", "--model", "--accelerator",
                                                   "--tier"))
        assert _flag(command, "--pool") == pool.replace("/", "/rank/", 1)
        assert _flag(command, "--worker-id") == _flag(worker, "--worker-id")
        assert _flag(command, "--worker-url") == f"http://127.0.0.1:{_flag(worker, '--port')}"
        assert _flag(command, "--cgroup") == "/proc/1/root/sys/fs/cgroup"
        assert services[name]["cpus"] > 0            # a quota for the agent to read and lend
    assert services["scheduler"]["profiles"] == ["scheduler"]


def test_the_control_laws_ask_rma_for_the_cpu_a_lent_slice_has(tmp_path: Path) -> None:
    """The agents lend each slice as one accelerator unit and its cores as CPU units; RMA's
    CPU per lent unit is that slice here, or the books would hold RMA to a fraction of it."""
    from streams.control.config import load_config

    services = yaml.safe_load(COMPOSE.read_text())["services"]
    code = re.search(r"python -c '(.*?)' >", services["control-plane"]["command"][2])
    assert code is not None
    done = subprocess.run([sys.executable, "-c", code.group(1)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "control.toml"
    path.write_text(done.stdout)
    eu1 = load_config(path).for_scope("eu1")
    assert eu1.allocator.cpu_per_accel_for_rma == services["worker-opportunistic"]["cpus"]
