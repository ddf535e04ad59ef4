"""One re-read of a key directory, and what to say about it: the pure step of key rotation.

Operators rotate keys by changing files (a Kubernetes Secret volume is updated in place within
a minute or so; a config-management run rewrites a directory), and expect the process to notice
without a restart. Each edge that runs a process calls `KeyReloader.poll` on its own schedule
(the worker's and the console commands' daemon thread, `workers.runtime.keywatch`; the control
plane's Faust timer, `streams.agents.control`): a changed ring is swapped in whole and logged by
key id (never the keys), a broken one is logged once and the ring held stays in use, so a
half-written directory never stops verification. No thread and no clock here.
"""

from __future__ import annotations

import logging

from schemas.signing import KeySource

log = logging.getLogger("surplus.keys")

#: Seconds between re-reads of a key directory by default: well inside the minutes a rotation
#: step waits, and a stat of a few files each time.
RELOAD_EVERY_S = 10.0


class KeyReloader:
    """Re-reads ``source`` on each `poll`, logging a change, and a broken directory once.

    :param source: the keyring the process holds; its ``ring`` is swapped in whole on a change.
    """

    def __init__(self, source: KeySource) -> None:
        self.source = source
        self._last_error: str | None = None

    def poll(self) -> bool:
        """Re-read the directory once; True when a new ring was swapped in. A ring that cannot
        be built keeps the one held and is logged once until it changes or is mended."""
        source = self.source
        try:
            changed = source.reload()
        except ValueError as exc:
            if str(exc) != self._last_error:
                log.error("signing keys not reloaded (keeping %s): %s", source.ring, exc)
            self._last_error = str(exc)
            return False
        self._last_error = None
        if changed:
            log.warning("signing keys reloaded from %s: %s", source.path, source.ring)
        return changed
