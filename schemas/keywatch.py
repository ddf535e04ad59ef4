"""Re-reading a key directory while the process runs: the edge of `schemas.signing.KeySource`.

Operators rotate keys by changing files (a Kubernetes Secret volume is updated in place within
a minute or so; a config-management run rewrites a directory), and expect the process to notice
without a restart. A daemon thread re-reads the path every ``every_s`` seconds: a changed ring
is swapped in whole and logged by key id (never the keys), a broken one is logged once and the
ring held stays in use, so a half-written directory never stops verification.
"""

from __future__ import annotations

import logging
import threading

from schemas.signing import KeySource

log = logging.getLogger("surplus.keys")

#: Seconds between re-reads of a key directory by default: well inside the minutes a rotation
#: step waits, and a stat of a few files each time.
RELOAD_EVERY_S = 10.0


def watch(source: KeySource, every_s: float = RELOAD_EVERY_S,
          stop: threading.Event | None = None) -> threading.Thread:
    """Start a daemon thread that reloads ``source`` every ``every_s`` until ``stop`` is set."""
    stop = stop or threading.Event()

    def run() -> None:
        last_error: str | None = None
        while not stop.wait(every_s):
            try:
                changed = source.reload()
            except ValueError as exc:
                if str(exc) != last_error:
                    log.error("signing keys not reloaded (keeping %s): %s", source.ring, exc)
                last_error = str(exc)
                continue
            last_error = None
            if changed:
                log.warning("signing keys reloaded from %s: %s", source.path, source.ring)

    thread = threading.Thread(target=run, name="surplus-key-reload", daemon=True)
    thread.start()
    return thread
