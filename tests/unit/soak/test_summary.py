"""Sample lines into series, and the table a person reads: every process, start -> end."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from surplus.cli import app
from surplus.soak.run import default_warmup_s
from surplus.soak.table import table
from surplus.soak.verdict import collect


def _line(t: float, pid: int, rss: float) -> dict[str, object]:
    return {"t_s": t, "processes": {"loadgen": {"pid": pid, "rss_mib": rss, "fds": 9,
                                                "threads": 3},
                                    "w": {"pid": 7, "rss_mib": 700.0, "fds": 30,
                                          "threads": 18, "consumer_lag": 0.0}}}


def test_samples_become_series_and_a_replaced_process_shows_two_pids() -> None:
    series, pids = collect([_line(0, 41, 100.0), _line(5, 41, 101.0), _line(10, 52, 90.0)])
    assert series["loadgen"]["rss_mib"] == [(0.0, 100.0), (5.0, 101.0), (10.0, 90.0)]
    assert series["w"]["consumer_lag"] == [(0.0, 0.0), (5.0, 0.0), (10.0, 0.0)]
    assert pids == {"loadgen": [41, 52], "w": [7]}


def test_the_warm_up_is_a_fifth_of_the_run_within_one_to_five_minutes() -> None:
    assert [default_warmup_s(m * 60) for m in (2.5, 10, 30, 120)] == [60, 120, 300, 300]


def test_the_table_has_a_row_per_process_and_marks_what_failed() -> None:
    summary = {"minutes": 10, "warmup_s": 120, "window_s": 48, "bound": 0.1, "ok": False,
               "processes": {
                   "loadgen": {"measures": {
                       "rss_mib": {"start": 130.1, "end": 150.2, "growth": 1.154, "ok": False},
                       "fds": {"start": 32, "end": 32, "growth": 1.0, "ok": True}}},
                   "broker": {"measures": {
                       "rss_mib": {"start": 1279.5, "end": 1290.0, "growth": 1.008,
                                   "ok": True}}}}}
    lines = table(summary).splitlines()
    assert lines[0].endswith("FAILED") and "from 120 s" in lines[0]
    assert lines[2].split()[:6] == ["loadgen", "130.1", "->", "150.2", "(x1.15)", "!"]
    assert "1,280 -> 1,290 (x1.01)" in lines[3] and "!" not in lines[3]


def test_a_run_judged_again_from_its_samples_names_what_grew(tmp_path: Path) -> None:
    samples = [{"t_s": t, "processes": {"loadgen": {"pid": 41, "rss_mib": 100.0 + t / 10,
                                                    "fds": 9, "threads": 3}}}
               for t in range(0, 600, 5)]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (tmp_path / "summary.json").write_text(json.dumps({
        "ok": True, "failures": [], "minutes": 10, "duration_s": 600, "warmup_s": 120,
        "interval_s": 5, "bound": 0.1, "scenario": "soak",
        "processes": {"loadgen": {"measures": {"rss_mib": {}, "fds": {}, "threads": {}}}}}))
    result = CliRunner().invoke(app, ["soak", "--report", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "FAILED loadgen rss_mib: grew 1.3" in result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["period_s"] == 2.0 and summary["window_s"] == 120.0
    assert summary["processes"]["loadgen"]["measures"]["fds"]["ok"]
    assert (tmp_path / "soak.txt").read_text().startswith("soak: 10 min")
