"""Sample lines into series, and the table a person reads: every process, start -> end."""

from __future__ import annotations

from surplus.soak.run import collect, default_warmup_s
from surplus.soak.table import table


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
