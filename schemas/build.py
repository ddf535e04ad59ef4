"""What build is running: the version `surplus --version` prints and every /metrics exposes as
`surplus_build_info`, so an operator can tell which release each process runs mid-rollout.

The version comes from the installed distribution's metadata (one source: pyproject), not from
a constant that a release could forget to bump.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


def surplus_version() -> str:
    """The installed version of surplus ("0+unknown" when run from a tree never installed)."""
    try:
        return version("surplus")
    except PackageNotFoundError:
        return "0+unknown"


def register_standard_collectors(registry: CollectorRegistry) -> None:
    """Process figures (CPU, memory, fds, start time, collector pauses) and build info in a
    process's own registry: prometheus_client adds them only to its global one, which Surplus
    does not serve."""
    from prometheus_client import Info, ProcessCollector

    from schemas.heap import observe_pauses

    ProcessCollector(registry=registry)
    observe_pauses(registry)
    Info("surplus_build", "The Surplus release and Python this process runs",
         registry=registry).info({"version": surplus_version(),
                                  "python": platform.python_version()})
