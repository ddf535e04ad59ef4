"""The demo summary's lift keys: measured from the recorded decisions and labels by the
control plane's own estimator, beside the true lift the load generator knows."""

from __future__ import annotations

from pathlib import Path

from sim.engine import Simulation
from sim.scenario import find_scenario, load_scenario
from surplus.demo.report import EVENT_LOG, measured_lift


def test_the_summary_sets_measured_lift_beside_the_true_lift(tmp_path: Path) -> None:
    scenario, base = load_scenario(find_scenario("demo"), duration_s=120.0)
    summary = Simulation(scenario, base, "surplus", tmp_path, log_name=EVENT_LOG).run()
    true = {k: v["lift_true"] for k, v in summary["lift"]["eu1"].items() if k != "counts"}
    got = measured_lift(tmp_path, "eu1", tmp_path / EVENT_LOG, {"lift_true": true})
    assert got["labels_joined"] == summary["labels"]["eu1"]["labels_joined"] > 0
    assert {"labels_late", "labels_orphan"} <= set(got)
    for lever in ("all", "sbm", "rma", "precompute"):   # the demo turns precompute on
        row = got["lift"][lever]
        assert set(row) == {"lift_measured", "lift_ci_low", "lift_ci_high", "lift_true"}
        assert row["lift_true"] == true[lever]
    all_ = got["lift"]["all"]
    # the demo's control config is the default one here (no control.toml in tmp_path), the
    # simulator's the scenario's: the join and the sums do not depend on the control laws
    assert all_["lift_measured"] is not None
    assert all_["lift_measured"] == summary["lift"]["eu1"]["all"]["lift_measured"]
    assert measured_lift(tmp_path, "eu1", tmp_path / "missing.jsonl", None) == {}


def test_the_report_page_sets_the_lift_beside_the_truth() -> None:
    from surplus.demo.report import _lift_notes

    row = {"lift_measured": 0.1, "lift_ci_low": 0.05, "lift_ci_high": 0.15, "lift_true": 0.11}
    notes = _lift_notes({"lift": {"all": row, "sbm": {"lift_measured": None, "lift_true": 0.0}},
                         "labels_joined": 900, "labels_late": 2, "labels_orphan": 1})
    assert notes and "all: 0.1000 [0.0500, 0.1500], true 0.11" in notes[0]
    assert "sbm: not measured yet" in notes[0] and "joined 900, late 2, orphan 1" in notes[0]
    assert _lift_notes({}) == []
