"""Where promtool is, for the tests that lint metrics and test alert rules with it."""

from __future__ import annotations

import os
import shutil

import pytest


def promtool() -> str:
    """$PROMTOOL, else promtool on the PATH; fails (never skips) naming the make target that
    installs it, so a machine without it cannot pass these tests silently."""
    path = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not path:
        pytest.fail("promtool not found: `make promtool` installs it (Debian's prometheus)")
    return path
