"""One log line per change: a problem that repeats every poll or every post is said once, and
once more when it clears, so a replica that stays unreachable does not flood the log."""

from __future__ import annotations

import threading
from collections.abc import Callable


class OncePerChange:
    """Problems by key (a metadata path, a replica URL); thread-safe."""

    def __init__(self, warn: Callable[[str], None]) -> None:
        self._warn = warn
        self._last: dict[str, str] = {}
        self._lock = threading.Lock()

    def problem(self, key: str, line: str) -> None:
        """Say ``line`` unless it is what ``key`` last said."""
        with self._lock:
            if self._last.get(key) == line:
                return
            self._last[key] = line
        self._warn(line)

    def fine(self, key: str, line: str | None = None) -> None:
        """``key`` works again; say ``line`` (if given) when it had a problem."""
        with self._lock:
            had = self._last.pop(key, None)
        if had is not None and line is not None:
            self._warn(line)
