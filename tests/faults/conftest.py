"""Fault tests print their figures (load held, recovery time, requests lost by class) in a
section of the test summary, whether or not output capture is on, and keep them as JSON in
``out/faults/figures.json`` for the reliability page (docs/reliability.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.fleet import Fleet

ROOT = Path(__file__).resolve().parents[2]
_FIGURES: dict[str, list[str]] = {}
_DATA: dict[str, dict[str, Any]] = {}


class Figures:
    """What one fault test measured, line by line, with the numbers kept as data too."""

    def __init__(self, test: str) -> None:
        self.test = test
        self.lines = _FIGURES.setdefault(test, [])
        self.data = _DATA.setdefault(test, {})

    def add(self, label: str, value: Any) -> None:
        self.data[label] = value
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        self.lines.append(f"{label}: {text}")
        print(f"[{self.test}] {label}: {text}")


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Figures:
    return Figures(request.node.name)


@pytest.fixture
def stopping() -> Iterator[list[Fleet]]:
    """Fleets registered here are stopped after the test, whatever happened."""
    fleets: list[Fleet] = []
    yield fleets
    for fleet in fleets:
        fleet.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("fault figures")
    for test, lines in _FIGURES.items():
        terminalreporter.write_line(test)
        for line in lines:
            terminalreporter.write_line(f"    {line}")
    out = ROOT / "out" / "faults"
    out.mkdir(parents=True, exist_ok=True)
    (out / "figures.json").write_text(json.dumps(_DATA, indent=2, default=str))
