"""The replay benchmark runs the real replay and its reference loop over one generated log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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


def test_remembered_allocations_change_no_byte_of_the_replay(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller answers inputs it has solved before from memory: the same targets,
    windows, estimates and summary as solving every tick, with fewer LPs."""
    import streams.control.allocation_memo as allocation_memo
    from streams.control.allocator import Allocation
    from streams.control.config import ControlConfig
    from streams.replay import replay_offline

    log = tmp_path / "b.jsonl"
    generate_log(log, workers=12, seconds=900, regions=2)
    solves: list[int] = []
    real = allocation_memo.allocate

    def counted(*args: Any, **kwargs: Any) -> Allocation:
        solves.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(allocation_memo, "allocate", counted)
    replay_offline(log, ControlConfig(), tmp_path / "memo")
    remembered = len(solves)
    solves.clear()
    monkeypatch.setattr(allocation_memo, "SOLVED_KEPT", 1)  # only the last input, as before
    replay_offline(log, ControlConfig(), tmp_path / "every")
    assert remembered < len(solves)
    for name in ("targets.csv", "windows.csv", "estimates.json", "summary.json"):
        assert (tmp_path / "memo" / name).read_bytes() == (tmp_path / "every" / name).read_bytes()
