"""The control core must run unchanged live, in offline replay and in the simulator: it imports
no Kafka client, Faust, torch or HTTP library, and reads no clock and no randomness."""

from __future__ import annotations

import ast
from pathlib import Path

import streams.control

FORBIDDEN = {"faust", "aiokafka", "confluent_kafka", "kafka", "torch", "aiohttp", "http",
             "requests", "httpx", "urllib", "urllib3", "socket", "asyncio",
             "time", "datetime", "random", "secrets", "uuid", "os"}


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_control_core_imports_nothing_impure() -> None:
    package = Path(streams.control.__file__).parent
    files = sorted(package.glob("*.py"))
    assert len(files) >= 9
    offenders = {f.name: sorted(imported_roots(f) & FORBIDDEN) for f in files}
    assert {k: v for k, v in offenders.items() if v} == {}
