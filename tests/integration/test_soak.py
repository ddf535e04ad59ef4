"""`surplus soak` for two and a half minutes on its own embedded broker (so the broker is
measured too): every process and every measure is in the report, and nothing grew.

What a short run can judge. Threads and open fds are counts a healthy process holds level once
it serves, so they are judged with the soak's own 10% bound, as a 30-minute run judges them, by
each window's lowest count (a short run's means once read 26 fds against 29: busy moments on a
loaded machine, not a leak); they are what the soak caught first (the HTTP connection pools of
the load generator and the workers grew a socket with each busier burst, for good, until workers
closed a connection after 100 responses). RSS is judged with the same bound after a 60 s warm-up
(means of the first and last 22 s of the 90 judged, a sample every 2 s), and that can fail here,
but only for a fast leak: against 130 MiB (the load generator; 700 MiB for a worker) it takes
about 12 MiB a minute (60 for a worker). The slow ones are for `make soak`: the load generator
holding every request's row until the end (about 0.5 MiB a minute) showed there, in 15 minutes,
as a steady climb that no short run could tell from noise. The broker's JVM touches its heap at
start (AlwaysPreTouch), so its RSS is level from the warm-up on too. Lag and targets age are
judged from their floors (100 messages; two control periods), where a ratio of two near-zero
values would say nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

RESOURCES = {"rss_mib", "fds", "threads"}
WORKERS = ("eu1-baseline-cpu-baseline-0", "eu1-baseline-cpu-opportunistic-0",
           "eu1-powerful-cpu-opportunistic-0")


@pytest.mark.timeout(480)
def test_a_short_soak_reports_every_process_and_measure_and_nothing_grows(
        tmp_path: Path) -> None:
    out = tmp_path / "soak"
    env = {k: v for k, v in os.environ.items()
           if k not in ("KAFKA_BOOTSTRAP_SERVERS", "SURPLUS_KAFKA_BOOTSTRAP")}
    proc = subprocess.run(
        [sys.executable, "-m", "surplus.cli", "soak", "--minutes", "2.5", "--warmup", "60",
         "--every", "2", "--out", str(out), "--prefix", f"t{uuid.uuid4().hex[:8]}.soak."],
        capture_output=True, text=True, env=env, timeout=450)
    output = proc.stdout + proc.stderr
    assert (out / "summary.json").is_file(), output[-3000:]
    summary = json.loads((out / "summary.json").read_text())

    expected = {"broker": RESOURCES, "control-plane": RESOURCES | {"consumer_lag"},
                "scheduler": RESOURCES, "loadgen": RESOURCES, "recorder": RESOURCES,
                **{w: RESOURCES | {"consumer_lag", "targets_age_s"} for w in WORKERS}}
    assert {name: set(p["measures"]) for name, p in summary["processes"].items()} == expected
    for name, proc_summary in summary["processes"].items():
        for measure, m in proc_summary["measures"].items():
            assert m["start"] is not None and m["end"] is not None, (name, measure, m)
            assert m["samples"] >= 10, (name, measure, m)
    assert summary["failures"] == [], output[-3000:]
    assert summary["ok"] and proc.returncode == 0, output[-3000:]
    assert summary["demo"]["baseline_requests_failed"] == 0
    table = (out / "soak.txt").read_text()
    assert all(name in table for name in expected) and "OK" in table.splitlines()[0]
