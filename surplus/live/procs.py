"""Child processes of a run: each `surplus` subcommand in its own session, logged to a file,
stopped by signal with a deadline, and tied to the parent's life so none outlives the run.

Own session: a Ctrl-C in the terminal reaches only the parent, which then stops the children
in the right order (load first, broker last) instead of all of them dying at once. Parent
death signal (Linux ``PR_SET_PDEATHSIG``): if the parent is killed outright (SIGKILL, OOM), the
kernel sends each child SIGTERM, so no worker is left serving for nobody.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGTERM when the parent thread exits."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _preexec(nice: int, enter: Callable[[], None] | None = None) -> Callable[[], None]:
    """What runs in the child before exec: its cgroup (``enter``, e.g. a CPU slice: a child
    that cannot join it fails to start rather than run unbounded), its CPU priority, then the
    parent-death signal."""

    def run() -> None:
        if enter is not None:
            enter()
        if nice:
            with contextlib.suppress(OSError):
                os.nice(nice)
        if sys.platform.startswith("linux"):
            _die_with_parent()

    return run


class Child:
    """One `surplus` subcommand (or any program, with ``program``) running for a run."""

    def __init__(self, name: str, args: list[str], log_dir: Path, *,
                 program: list[str] | None = None, env: dict[str, str] | None = None,
                 nice: int = 0, enter: Callable[[], None] | None = None) -> None:
        self.name = name
        #: Run in the child before exec (``Slice.enter``: its CPU slice, whole life long).
        self.enter = enter
        #: Added to the child's niceness: a process off the serving and preemption paths
        #: (the control plane, the recorder) yields the CPU to those that are on them.
        self.nice = nice
        self.args = args
        self.log_path = log_dir / f"{name}.log"
        self.program = program if program is not None else [sys.executable, "-m", "surplus.cli"]
        self.env = env
        self.popen: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None

    def start(self) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                [*self.program, *self.args], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, **(self.env or {})},
                preexec_fn=_preexec(self.nice, self.enter))
        return self

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def send(self, sig: int) -> None:
        """Signal the child's whole process group (it leads its own session)."""
        if self.alive():
            assert self.popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def wait(self, timeout_s: float) -> int | None:
        if self.popen is None:
            return None
        try:
            self.returncode = self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        return self.returncode

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int | None:
        """Ask it to stop with ``sig``; SIGKILL its group if it has not within ``timeout_s``."""
        if self.popen is None:
            return None
        self.send(sig)
        if self.wait(timeout_s) is None:
            self.send(signal.SIGKILL)
            self.wait(10.0)
        self._reap_group()
        return self.returncode

    def _reap_group(self) -> None:
        """Anything the child left in its process group goes too (e.g. a forked helper)."""
        assert self.popen is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.25,
               stop: Callable[[], bool] | None = None) -> bool:
    """Poll ``predicate()`` until true, ``timeout_s`` passes or ``stop()`` is true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stop is not None and stop():
            return False
        if predicate():
            return True
        time.sleep(interval_s)
    return False


def metrics_text(port: int, timeout_s: float = 3.0) -> str | None:
    """The /metrics text of a child on this host, None when it does not answer."""
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return str(resp.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None
