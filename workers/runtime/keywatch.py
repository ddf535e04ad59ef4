"""Re-reading a key directory while the process runs, on a daemon thread: the edge of
`schemas.keywatch.KeyReloader` for the worker and the console commands (the control plane
polls it from a Faust timer instead, `streams.agents.control`).

The thread calls `KeyReloader.poll` every ``every_s`` seconds until ``stop`` is set; what a
change or a broken directory does to the ring held is the reloader's rule.
"""

from __future__ import annotations

import threading

from schemas.keywatch import RELOAD_EVERY_S, KeyReloader
from schemas.signing import KeySource

__all__ = ["RELOAD_EVERY_S", "watch"]


def watch(source: KeySource, every_s: float = RELOAD_EVERY_S,
          stop: threading.Event | None = None) -> threading.Thread:
    """Start a daemon thread that reloads ``source`` every ``every_s`` until ``stop`` is set.

    :param source: the keyring to keep current.
    :param every_s: seconds between re-reads.
    :param stop: set it to end the thread (None: it runs as long as the process).
    """
    stop = stop or threading.Event()
    reloader = KeyReloader(source)

    def run() -> None:
        while not stop.wait(every_s):
            reloader.poll()

    thread = threading.Thread(target=run, name="surplus-key-reload", daemon=True)
    thread.start()
    return thread
