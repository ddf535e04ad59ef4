"""The wall clock: its skew hook (a bad value names the variable) and its stamps at a millisecond's
edge."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CODE = ("import time; from schemas.clock import wall_ms, wall_ms_fine; "
        "print(wall_ms() - time.time_ns() // 10**6, round(wall_ms_fine() - time.time_ns() / 1e6))")


def _run(value: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                          env={"SURPLUS_CLOCK_OFFSET_MS": value, "PYTHONPATH": str(ROOT)},
                          check=False)


def test_the_offset_moves_the_processs_wall_clock_both_readings() -> None:
    out = _run("-2000")
    assert out.returncode == 0, out.stderr
    coarse, fine = (int(v) for v in out.stdout.split())
    assert -2001 <= coarse <= -1999
    assert -2001 <= fine <= -1999


def test_a_bad_offset_stops_the_process_naming_the_variable() -> None:
    out = _run("2s")
    assert out.returncode != 0
    assert "SURPLUS_CLOCK_OFFSET_MS: expected whole milliseconds, got '2s'" in out.stderr


def test_a_stamp_taken_at_the_edge_is_never_after_the_moment_it_leaves() -> None:
    from schemas.clock import wall_ms_at_edge, wall_ms_fine

    for _ in range(20):
        before = wall_ms_fine()
        stamp = wall_ms_at_edge()
        after = wall_ms_fine()
        assert isinstance(stamp, int)
        assert before < stamp <= after      # a millisecond begun after the call, not before
