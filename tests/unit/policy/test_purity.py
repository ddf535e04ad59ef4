"""The data-plane policies run unchanged in workers, clients, replay and the simulator: they
import no Kafka client, Faust, torch or HTTP library, and read no clock and no ambient
randomness (the router's generator is seeded by its caller)."""

from __future__ import annotations

import ast
from pathlib import Path

import workers.policy

FORBIDDEN = {"faust", "aiokafka", "confluent_kafka", "kafka", "torch", "aiohttp", "http",
             "requests", "httpx", "urllib", "urllib3", "socket", "asyncio",
             "time", "datetime", "random", "secrets", "uuid", "os", "threading"}
WORKERS = Path(workers.policy.__file__).parent.parent
# Outside policy/ but pure too: the HTTP body shapes and the client's decision core (which the
# client-decision benchmark times without any I/O).
ALSO_PURE = ["api.py", "client/decision.py", "client/config.py"]


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_policy_and_decision_core_import_nothing_impure() -> None:
    files = sorted((WORKERS / "policy").glob("*.py")) + [WORKERS / p for p in ALSO_PURE]
    assert len(files) >= 7
    offenders = {str(f.relative_to(WORKERS)): sorted(imported_roots(f) & FORBIDDEN)
                 for f in files}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_pure_modules_do_not_import_the_edge_packages_of_workers() -> None:
    for path in [*(WORKERS / "policy").glob("*.py"), *(WORKERS / p for p in ALSO_PURE)]:
        text = path.read_text()
        assert "workers.runtime" not in text and "workers.client.client" not in text, path
        assert "workers.client.feed" not in text, path
