"""The hindsight oracle: per window, the best safe setting of the sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.metrics import TIMELINE_COLUMNS
from sim.oracle import choose, ratio, stitch
from streams.replay_output import csv_line


def _timeline(path: Path, windows: list[tuple[float, bool, int]]) -> Path:
    """A run directory whose timeline has one row per (value, violated, rejected) window."""
    path.mkdir(parents=True)
    with (path / "timeline.csv").open("w", encoding="utf-8") as fh:
        fh.write(csv_line(TIMELINE_COLUMNS))
        for i, (value, violated, rejected) in enumerate(windows):
            row = {c: 0 for c in TIMELINE_COLUMNS} | {
                "t_s": 5.0 * (i + 1), "region": "eu1", "requests": 100,
                "violation": violated, "incremental_value": value, "rejected": rejected,
                "rma_limited_by": "", "sbm_limited_by": ""}
            fh.write(csv_line(tuple(row[c] for c in TIMELINE_COLUMNS)))
    return path


def test_each_window_takes_the_most_valuable_safe_setting(tmp_path: Path) -> None:
    sweep = {
        (0, 0.0): _timeline(tmp_path / "zero", [(0.0, False, 0)] * 3),
        (10, 0.5): _timeline(tmp_path / "low", [(5.0, False, 0), (6.0, False, 0),
                                                 (4.0, False, 0)]),
        (99, 1.0): _timeline(tmp_path / "high", [(9.0, False, 0), (20.0, True, 0),
                                                  (30.0, False, 2)]),
    }
    summary = stitch(sweep, tmp_path / "oracle")
    assert summary["incremental_value"] == 9.0 + 6.0 + 4.0   # unsafe windows never count
    assert summary["baseline_sla_violation_windows"] == 0
    assert summary["oracle"]["picks"] == {"extra=10 coverage=0.5": 2, "extra=99 coverage=1": 1}
    written = (tmp_path / "oracle" / "timeline.csv").read_text().splitlines()
    assert len(written) == 4
    assert json.loads((tmp_path / "oracle" / "summary.json").read_text())["windows"] == 3


def test_a_window_no_setting_keeps_safe_falls_back_to_no_optional_work(tmp_path: Path) -> None:
    rows = {(0, 0.0): {"violation": "1", "rejected": "0", "incremental_value": "0"},
            (8, 0.0): {"violation": "1", "rejected": "0", "incremental_value": "3"}}
    assert choose(rows) == (0, 0.0)


def test_ties_go_to_less_optional_work() -> None:
    row = {"violation": "0", "rejected": "0", "incremental_value": "2"}
    assert choose({(0, 0.0): {**row, "incremental_value": "0"}, (16, 0.5): row,
                   (8, 0.5): row}) == (8, 0.5)


def test_sweeps_of_different_lengths_are_refused(tmp_path: Path) -> None:
    sweep = {(0, 0.0): _timeline(tmp_path / "a", [(0.0, False, 0)] * 2),
             (8, 0.0): _timeline(tmp_path / "b", [(1.0, False, 0)] * 3)}
    with pytest.raises(ValueError, match="different timelines"):
        stitch(sweep, tmp_path / "oracle")


def test_value_vs_oracle_is_undefined_when_the_oracle_earned_nothing() -> None:
    assert ratio(5.0, 0.0) is None
    assert ratio(9.0, 10.0) == 0.9


def test_compare_with_the_oracle_runs_the_sweep_and_bounds_best_static_per_window(
        tmp_path: Path) -> None:
    from sim.run import compare

    summary = compare("preemption_storm_tight", ["surplus", "best-static", "oracle"],
                      tmp_path, duration_s=20.0,
                      static_grid={"extra_candidates": [0, 50], "coverage": [0.0, 1.0]})
    table = summary["table"]
    assert table["oracle"]["incremental_value"] >= table["best-static"]["incremental_value"]
    assert table["oracle"]["baseline_sla_violation_windows"] == 0
    assert summary["value_vs_oracle"]["surplus"] == ratio(
        table["surplus"]["incremental_value"], table["oracle"]["incremental_value"])
    assert "value_vs_oracle" in table["best-static"]
    assert sum(summary["oracle"]["picks"].values()) == table["oracle"]["windows"]
    assert "oracle" in (tmp_path / "report.html").read_text()
