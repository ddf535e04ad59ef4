"""The layering rules of DESIGN.md, enforced on the source (every rule here can fail).

- Pure code (schemas, streams/control, workers/policy, and the client's decision core) imports
  no Kafka client, Faust, torch, HTTP library, clock or ambient randomness: the same code runs
  live, in offline replay and in the simulator.
- Dependencies point down: surplus -> sim -> streams, workers -> schemas. streams and workers
  never import each other; nothing below surplus imports it; nothing below sim imports it.
- Faust is imported only by the control plane's app and agents, and by the command that runs
  them (`surplus control-plane` starts Faust's worker), in every package but the tests.
- confluent-kafka is imported only by `schemas/kafka_clients.py`, in every package (surplus,
  bench and infra's scripts) and the tests: client construction, assignment and
  end-of-partition handling have one home.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMPURE = {"faust", "aiokafka", "confluent_kafka", "kafka", "torch", "aiohttp", "http",
          "requests", "httpx", "urllib", "urllib3", "socket", "asyncio", "threading",
          "time", "datetime", "random", "secrets", "uuid", "os", "mode"}
PURE = ["schemas/contract.py", "schemas/codec.py", "schemas/sketch.py", "schemas/topics.py",
        "schemas/signing.py", "schemas/keywatch.py",
        "streams/control/*.py", "workers/policy/*.py", "workers/api.py", "workers/wire/*.py",
        "workers/client/decision.py", "workers/client/config.py", "workers/capacity/decide.py",
        "workers/capacity/lend.py", "workers/capacity/platform.py", "workers/capacity/cgroup.py",
        "workers/runtime/oip_wire.py",
        # The chaos checker judges a history with no clock, process or Kafka in reach (its
        # schedule draws from a seeded `random.Random`, the one import it needs).
        "surplus/chaos/check.py", "surplus/chaos/history.py", "surplus/chaos/config.py",
        "surplus/fleet/records.py"]
# Packages a layer must not import (its own and lower layers are fine).
FORBIDDEN_LAYERS = {
    "schemas": {"streams", "workers", "sim", "surplus", "bench"},
    "streams": {"workers", "sim", "surplus", "bench"},
    "workers": {"streams", "sim", "surplus", "bench"},
    "sim": {"surplus", "bench"},
}
# Project modules that are a Kafka client or a clock: impure although they live in schemas.
IMPURE_MODULES = {"schemas.kafka_clients", "schemas.clock"}
FAUST_ALLOWED = {"streams/app.py", "surplus/control_cmd.py"}
KAFKA_CLIENTS = "schemas/kafka_clients.py"
PACKAGES = ["schemas/**/*.py", "streams/**/*.py", "workers/**/*.py", "sim/**/*.py",
            "surplus/**/*.py", "bench/**/*.py", "infra/**/*.py"]
ALL_CODE = [*PACKAGES, "tests/**/*.py"]


def imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def roots(path: Path) -> set[str]:
    return {m.split(".")[0] for m in imported_modules(path)}


def files(*patterns: str) -> list[Path]:
    found = sorted({p for pattern in patterns for p in ROOT.glob(pattern)})
    assert found, patterns
    return found


def test_pure_modules_import_nothing_impure() -> None:
    offenders = {str(p.relative_to(ROOT)):
                 sorted(roots(p) & IMPURE | imported_modules(p) & IMPURE_MODULES)
                 for p in files(*PURE)}
    assert {k: v for k, v in offenders.items() if v} == {}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN_LAYERS))
def test_dependencies_point_down(layer: str) -> None:
    offenders = {str(p.relative_to(ROOT)): sorted(roots(p) & FORBIDDEN_LAYERS[layer])
                 for p in files(f"{layer}/**/*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_only_the_control_plane_app_and_agents_import_faust() -> None:
    users = {str(p.relative_to(ROOT)) for p in files(*PACKAGES) if "faust" in roots(p)}
    assert {u for u in users if u not in FAUST_ALLOWED and not u.startswith("streams/agents/")
            } == set()


def test_pure_client_core_does_not_reach_into_the_edge() -> None:
    for path in files("workers/policy/*.py", "workers/api.py", "workers/wire/*.py",
                      "workers/client/decision.py"):
        edge = {m for m in imported_modules(path)
                if m.startswith(("workers.runtime", "workers.client.client",
                                 "workers.client.feed", "workers.client.transport"))}
        assert not edge, (path, edge)


#: Calls that read the wall clock; only `schemas/clock.py` may make them (its offset hook and
#: one time base: a process run as if its host's clock were off is off everywhere).
WALL_CLOCK_READS = {("time", "time"), ("time", "time_ns"), ("datetime", "now"),
                    ("datetime", "utcnow"), ("datetime", "today")}


def _wall_clock_reads(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name | ast.Attribute)):
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr
            if (name, node.func.attr) in WALL_CLOCK_READS:
                found.append(f"line {node.lineno}: {name}.{node.func.attr}()")
    return found


def test_only_the_clock_module_reads_the_wall_clock() -> None:
    offenders = {str(p.relative_to(ROOT)): _wall_clock_reads(p) for p in files(*PACKAGES)
                 if str(p.relative_to(ROOT)) != "schemas/clock.py"}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_only_the_kafka_clients_module_imports_confluent_kafka() -> None:
    users = {str(p.relative_to(ROOT)) for p in files(*ALL_CODE) if "confluent_kafka" in roots(p)}
    assert users == {KAFKA_CLIENTS}
