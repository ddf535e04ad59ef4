"""The processes of a demo run by name: started with their niceness, watched for an early
death, asked whether they are ready, and stopped one by one with a word when one ends badly.

Every child runs in its own session with a parent-death signal (``surplus.live.procs.Child``),
so none outlives the run.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path

from surplus.demo.options import BACKGROUND, DemoError, Interrupted
from surplus.live.procs import Child, wait_until

#: Children that may end on their own, status 0, when their timeline is over (a moment
#: before the run's).
MAY_FINISH = ("scheduler", "loadgen")


class Children(dict[str, Child]):
    """The run's processes by name (a dict, so a longer run can walk them as they are).

    :param logs: the directory each child's log is written to.
    :param say: prints one line to the user.
    :param offline: the workers expected not to run now (not lent yet, or taken back).
    :param background_nice: the niceness of the ``BACKGROUND`` children.
    """

    def __init__(self, logs: Path, say: Callable[[str], None],
                 offline: Callable[[], set[str]], background_nice: int) -> None:
        super().__init__()
        self.logs = logs
        self.say = say
        self.offline = offline
        self.background_nice = background_nice

    def launch(self, name: str, args: list[str], program: list[str] | None = None) -> Child:
        """Start a ``surplus`` subcommand (or ``program``) as ``name``."""
        nice = self.background_nice if name in BACKGROUND else 0
        child = Child(name, args, self.logs, program=program, nice=nice).start()
        self[name] = child
        return child

    def dead(self) -> list[str]:
        """Children that should be running and are not."""
        offline = self.offline()
        dead = []
        for name, child in list(self.items()):
            if child.popen is None or name in offline or name == "prometheus":
                continue
            if child.alive():
                continue
            if child.popen.poll() == 0 and name in MAY_FINISH:
                continue
            dead.append(name)
        return dead

    def check_alive(self) -> None:
        """A child that died means the run is broken: DemoError with its log's tail."""
        for name in self.dead():
            child = self[name]
            status = child.popen.poll() if child.popen else None
            raise DemoError(f"{name} exited with status {status}:\n{child.tail()}")

    def wait_ready(self, name: str, port: int, timeout_s: float, stop: threading.Event) -> None:
        """Wait for ``name``'s ``/readyz`` (a worker: model warm, Kafka read; the control
        plane: partitions assigned, state read back, ticking); a child's death or ``stop``
        ends the wait early. Raises Interrupted once ``stop`` is set, DemoError with the
        log's tail when a child died or ``name`` was not ready in time."""
        ok = wait_until(partial(ready, port), timeout_s, 0.5,
                        stop=lambda: stop.is_set() or bool(self.dead()))
        if stop.is_set():
            raise Interrupted
        self.check_alive()
        if not ok:
            raise DemoError(f"{name} not ready within {timeout_s:.0f}s:\n{self[name].tail()}")

    def stop_one(self, name: str, sig: int, timeout_s: float) -> None:
        """Stop ``name`` (if it was started) with ``sig``, killing it after ``timeout_s``;
        say so when it ends with a status other than a clean stop's."""
        child = self.get(name)
        if child is None:
            return
        was_alive = child.alive()
        rc = child.stop(sig, timeout_s)
        if was_alive and rc not in (0, None, -sig, 128 + sig, 130):
            self.say(f"{name}: exited with status {rc} (log: {child.log_path})")

    def alive(self) -> list[str]:
        """The children still running."""
        return [name for name, child in self.items() if child.alive()]


def ready(port: int, timeout_s: float = 2.0) -> bool:
    """Whether the process serving ``port`` on loopback answers ``/readyz`` with 200."""
    url = f"http://127.0.0.1:{port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False
