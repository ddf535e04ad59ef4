"""One run of the storm scenario under every controller, shared by the scenario tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sim.run import compare

CONTROLLERS = ("surplus", "naive", "static", "greedy")


@pytest.fixture(scope="session")
def storm_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """(directory, compare summary) of ``preemption_storm`` under all four controllers."""
    out = tmp_path_factory.mktemp("storm_compare")
    return out, compare("preemption_storm", CONTROLLERS, out)
