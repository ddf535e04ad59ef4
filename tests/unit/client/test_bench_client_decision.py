"""The client-decision benchmark runs the real decision path and reports a ratio (not timed)."""

from __future__ import annotations

import json

import pytest

from bench import client_decision


def test_run_reports_medians_ratio_and_exercises_routing() -> None:
    result = client_decision.run(2_000)
    assert result["n"] == 2_000
    assert result["median_ns"] > 0 and result["reference_median_ns"] > 0
    ratio = result["median_ns"] / result["reference_median_ns"]
    assert abs(result["ratio"] - ratio) < 0.05
    assert abs(result["powerful_share"] - 0.3) < 0.05
    json.dumps(result)


def test_main_prints_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    client_decision.main(["1000"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["bench"] == "client_decision"
