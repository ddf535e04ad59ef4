"""MLServer, a model server nobody here wrote, for the OIP backend's tests and benchmark.

MLServer lives in a virtualenv of its own (``.venv-mlserver``, made by ``make mlserver`` from
``infra/mlserver/requirements.txt``), so its dependencies (FastAPI, gRPC, scikit-learn, pandas)
never meet Surplus's. :func:`build_repository` has that virtualenv's Python build a model
repository (``infra/mlserver/build_model.py``: a scikit-learn ranker over the worker's
features); :class:`MLServer` runs ``mlserver start`` on it on free 127.0.0.1 ports, waits until
``GET /v2/health/ready`` answers, and stops it (SIGTERM, then SIGKILL) on exit.

Without the virtualenv these raise :class:`MLServerMissing`, which says what to run: the tests
that use them fail rather than skip, so ``make test`` cannot pass without a real server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from surplus.localkafka import REPO_ROOT, free_port_block

VENV = REPO_ROOT / ".venv-mlserver"
BUILD_SCRIPT = REPO_ROOT / "infra" / "mlserver" / "build_model.py"
START_TIMEOUT_S = 120.0


class MLServerMissing(RuntimeError):
    """MLServer's virtualenv is not there (``make mlserver`` makes it)."""


def _bin(name: str) -> Path:
    path = VENV / "bin" / name
    if not path.exists():
        raise MLServerMissing(f"{path} is missing: run `make mlserver` (MLServer 1.7.1 in its own "
                              f"virtualenv, {VENV.name}) first")
    return path


def build_repository(out: Path, *, name: str = "ranker", num_dense: int = 13,
                     num_sparse: int = 8, sparse_shape: int | None = None,
                     declare_inputs: bool = True) -> Path:
    """A model repository in ``out`` with one model, ``name``; returns ``out``.

    ``sparse_shape`` and ``declare_inputs=False`` make its metadata wrong or empty (tests of
    the worker's start-up check)."""
    args = [str(_bin("python")), str(BUILD_SCRIPT), str(out), "--name", name,
            "--num-dense", str(num_dense), "--num-sparse", str(num_sparse)]
    if sparse_shape is not None:
        args += ["--input-shape-sparse", str(sparse_shape)]
    if not declare_inputs:
        args.append("--no-inputs")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"building the MLServer model failed: {proc.stderr.strip()[-500:]}")
    return out


def coefficients(repository: Path, name: str = "ranker") -> dict[str, Any]:
    """The linear model's weights (``build_model.py``), to compute the scores expected."""
    loaded: dict[str, Any] = json.loads((repository / name / "coefficients.json").read_text())
    return loaded


class MLServer:
    """``mlserver start REPOSITORY`` for a ``with`` block; ``url`` is its REST endpoint."""

    def __init__(self, repository: Path, start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.repository = repository
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.url = ""
        self.log_path = repository / "mlserver.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> MLServer:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        """Start it on free ports (REST and gRPC; metrics off), one process, and wait until it
        says ready; raises with the tail of its log if it exits or is not ready in time."""
        binary = _bin("mlserver")
        self.port = free_port_block(2)
        # Ports in settings.json, not the environment: MLServer's settings file wins over
        # MLSERVER_* variables. parallel_workers 0: inference in the server process, as one
        # small model needs, rather than a pool of worker processes on a two-core machine.
        (self.repository / "settings.json").write_text(json.dumps({
            "host": "127.0.0.1", "http_port": self.port, "grpc_port": self.port + 1,
            "metrics_endpoint": None, "parallel_workers": 0, "debug": False,
            "gzip_enabled": False, "load_models_at_startup": True}) + "\n")
        self.url = f"http://127.0.0.1:{self.port}"
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen([str(binary), "start", str(self.repository)],
                                          stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while not self._ready():
            if self._proc.poll() is not None:
                raise RuntimeError(f"mlserver exited with {self._proc.returncode}: "
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mlserver not ready after {self.start_timeout_s:.0f} s: "
                                   f"{self.log_tail()}")
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        """SIGTERM to its process group (MLServer's own workers too), SIGKILL after 10 s."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"
