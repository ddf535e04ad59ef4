"""The replay benchmark runs the real replay and its reference loop over one generated log."""

from __future__ import annotations

from pathlib import Path

from bench.replay import generate_log, reference_loop, run
from streams.eventlog import read_events


def test_generated_log_is_a_valid_time_ordered_log(tmp_path: Path) -> None:
    n = generate_log(tmp_path / "b.jsonl", workers=10, seconds=12, regions=2)
    reader = read_events(tmp_path / "b.jsonl", strict=True)
    events = list(reader)
    assert len(events) == n == reference_loop(tmp_path / "b.jsonl")
    assert reader.out_of_order == 0
    assert {e.topic for e in events} == {"telemetry", "capacity", "preemption", "outcomes"}


def test_run_reports_throughput_and_the_ratio_to_the_reference() -> None:
    result = run(seconds=15, workers=10, repeat=1)
    assert result["bench"] == "replay" and result["events"] > 15 * 10
    assert result["events_per_s"] > 0 and result["reference_events_per_s"] > 0
    ratio = result["events_per_s"] / result["reference_events_per_s"]
    assert abs(result["ratio_vs_reference"] - ratio) < 0.01
    assert isinstance(result["within_target"], bool)
