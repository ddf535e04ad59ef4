"""Go programs the fault suite and `surplus chaos` run for real (toxiproxy, ec2-metadata-mock),
built by the Makefile.

Each is pinned in the Makefile and built with Go into the git-ignored `.tools/` of a checkout;
what can find or build neither fails, saying so: a fault whose tool does not run is one that
cannot fail.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from surplus.live.procs import Child

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 600


class ToolError(AssertionError):
    """A tool could not be built or started; the message says why."""


def built(name: str, target: str, source: str) -> Path:
    """`.tools/<name>`, built by `make <target>` first when it is missing (a fresh clone that
    runs one test by hand); ``source`` (the Go module) is named in the failure."""
    binary = ROOT / ".tools" / name
    if binary.exists():
        return binary
    try:
        proc = subprocess.run(["make", "-s", target], cwd=ROOT, capture_output=True,
                              text=True, timeout=BUILD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolError(f"{name} missing at {binary} and `make {target}` could not run: "
                        f"{exc}") from exc
    if proc.returncode != 0 or not binary.exists():
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:]) or "no output"
        raise ToolError(f"{name} missing at {binary} and `make {target}` (Go, {source}) "
                        f"failed: {tail}")
    return binary


def start_answering(child: Child, probe: Callable[[], object], timeout_s: float = 20.0) -> None:
    """Start ``child`` and wait until ``probe()`` stops raising OSError (it answers); stopped
    and ToolError with the log's tail when it exits or stays silent for ``timeout_s``."""
    child.start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not child.alive():
            raise ToolError(f"{child.name} exited at start: {child.tail()}")
        try:
            probe()
            return
        except OSError:
            time.sleep(0.1)
    child.stop(timeout_s=5.0)
    raise ToolError(f"{child.name} did not answer within {timeout_s:.0f}s: {child.tail()}")
