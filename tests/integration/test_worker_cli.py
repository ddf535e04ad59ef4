"""`surplus worker` as a real process: serves until SIGTERM then exits 0; bad config exits 1
before anything starts, naming the key."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.integration.worker_support import body

TINY_TOML = """
worker_id = "cli-w1"
[model]
device = "cpu"
threads = 1
[model.config]
num_dense = 4
num_sparse = 3
rows_per_table = 64
embedding_dim = 4
bottom_mlp = [8]
top_mlp = [8]
"""


def surplus(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SURPLUS_KAFKA_")}
    return subprocess.Popen([sys.executable, "-m", "surplus.cli", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)


def test_worker_serves_until_sigterm_then_exits_cleanly(tmp_path: Path) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(TINY_TOML)
    proc = surplus("worker", "--config", str(config), "--port", "0", "--no-kafka",
                   "--pool", "eu1/rank/baseline/cpu/opportunistic", "--loglevel", "warning")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"ready on (http://[\d.]+:\d+)", line)
        assert match, line + (proc.stderr.read() if proc.stderr else "")
        assert "pool eu1/rank/baseline/cpu/opportunistic" in line
        base = match.group(1)
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as resp:
            assert json.load(resp)["worker_id"] == "cli-w1"
        request = urllib.request.Request(f"{base}/v1/rank", data=body(3, 1),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert json.load(resp)["scored"] == 3
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0
        assert "worker stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.slow
def test_bad_config_stops_the_worker_at_start_naming_the_key(tmp_path: Path) -> None:
    good = tmp_path / "worker.toml"
    good.write_text(TINY_TOML)
    bad = tmp_path / "bad.toml"
    bad.write_text(TINY_TOML + "[batching]\nmax_batch_rowz = 3\n")
    cases = [
        (["--config", str(bad), "--no-kafka"], "unknown field `max_batch_rowz` - at `$.batching`"),
        (["--config", str(good), "--tier", "spot"], "at `$.tier`"),
        (["--config", str(good), "--pool", "eu1/rank"], "bad --pool 'eu1/rank'"),
        (["--config", str(good), "--bootstrap", "x"], "`kafka.bootstrap`"),
        (["--config", str(good), "--no-kafka", "--model-path", str(tmp_path / "no.pt2")],
         "`model.path`: model file"),
        (["--config", str(good), "--precompute"], "`precompute.enabled`: only an opportunistic"),
        (["--config", str(good), "--no-kafka", "--precompute", "--tier", "opportunistic"],
         "`precompute.enabled`: precompute jobs come from Kafka"),
    ]
    procs = [surplus("worker", "--port", "0", *args) for args, _ in cases]  # side by side
    for (args, named), proc in zip(cases, procs, strict=True):
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 1, (args, err)
        assert named in err, (args, err)
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
