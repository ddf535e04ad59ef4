"""Child processes of a run stop on request, are killed when they will not, and take their
process group with them; the load generator's arrivals follow the scenario's rate; the bench
table keeps a failed benchmark as a failed row."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from surplus.bench_cmd import Bench, meets, run_one
from surplus.live import loadgen, plan
from surplus.live.procs import Child

STUBBORN = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('up', flush=True); time.sleep(60)")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text() if Path(f"/proc/{pid}/stat").exists() else ""
    return bool(stat) and stat.split(")")[-1].split()[0] != "Z"


def test_a_child_that_ignores_sigterm_is_killed_with_its_group(tmp_path: Path) -> None:
    child = Child("stubborn", ["-c", STUBBORN], tmp_path, program=[sys.executable]).start()
    deadline = time.monotonic() + 10
    while "up" not in child.log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child.pid is not None
    group = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
             and _pgid(int(p.name)) == child.pid]
    assert len(group) == 2
    started = time.monotonic()
    rc = child.stop(signal.SIGTERM, timeout_s=1.0)
    assert rc == -signal.SIGKILL
    assert time.monotonic() - started < 5
    time.sleep(0.2)
    assert not any(_alive(pid) for pid in group)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_a_child_that_stops_on_sigterm_reports_its_status(tmp_path: Path) -> None:
    child = Child("polite", ["-c", "import time; time.sleep(30)"], tmp_path,
                  program=[sys.executable]).start()
    assert child.alive()
    assert child.stop(signal.SIGTERM, timeout_s=10) == -signal.SIGTERM
    assert not child.alive()


def test_a_background_child_runs_at_the_niceness_it_was_given(tmp_path: Path) -> None:
    code = "import os; print('nice', os.nice(0), flush=True)"
    base = os.nice(0)
    child = Child("bg", ["-c", code], tmp_path, program=[sys.executable], nice=5).start()
    assert child.wait(10.0) == 0
    assert f"nice {min(base + 5, 19)}" in child.log_path.read_text()


def test_arrivals_follow_the_scenario_rate_and_are_sorted() -> None:
    scenario, base = plan.load("demo", 60.0)
    region = scenario.regions[0]
    offsets = loadgen.arrival_offsets_ms(region, scenario, base, 60.0)
    assert np.all(np.diff(offsets) >= 0) and offsets[0] >= 0 and offsets[-1] < 60_000
    assert abs(len(offsets) / 60.0 - region.arrivals.mean_rps) < 0.25 * region.arrivals.mean_rps
    doubled = loadgen.arrival_offsets_ms(region, scenario, base, 60.0, rate=60.0)
    assert 1.8 < len(doubled) / len(offsets) < 2.2


def test_more_extra_candidates_are_worth_less_each() -> None:
    scenario, _ = plan.load("demo")
    region = scenario.regions[0]
    values = [loadgen.rma_value(region, k) for k in (0, 16, 32, 48)]
    assert values[0] == 0.0
    gains = np.diff(values)
    assert np.all(gains > 0) and np.all(np.diff(gains) < 0)


def test_a_benchmark_that_cannot_run_is_a_failed_row_not_a_lost_table() -> None:
    row = run_one(Bench("nothing", "no_such_bench", {}), None, timeout_s=60)
    assert row["ok"] is False and "exit 1" in row["error"]
    assert meets("ingest", {"meets_target": True}) is True
    assert meets("batching", {"meets_target": False}) is False
    assert meets("replay", {"within_target": False}) is False
