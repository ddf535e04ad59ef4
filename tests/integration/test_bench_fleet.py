"""`surplus bench fleet` end to end on a real broker: a small synthetic fleet, two real
control-plane processes, and the result's keys. Low rates, so it holds on a loaded machine:
it asserts what was measured and published, not how fast."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

KEYS = ("keeps_up", "targets_after_close_p99_s", "cpu_us_per_event", "rss_mb_max",
        "raw_cpu_us_per_event", "achieved_rps")


def test_a_small_fleet_reaches_two_control_plane_processes_and_gets_targets(
        kafka_bootstrap: str) -> None:
    from bench.fleet import run

    result = run(replicas=12, rps=120.0, sample=0.5, processes=2, seconds=15.0,
                 bootstrap=kafka_bootstrap)
    print(json.dumps(result))
    json.loads(json.dumps(result))  # the last line of `surplus bench fleet` is this object
    assert all(key in result for key in KEYS)
    assert result["processes_alive"] is True
    # every report, decision record and label written was taken by the control plane
    assert result["events_written"] > 0
    assert result["events_counted"] == result["events_written"]
    # every scope got targets, and windows closed after the warm-up were followed by them
    assert result["scopes_with_targets"] == result["regions"] == 4
    assert result["targets_published"] >= 4
    assert result["targets_after_close_p99_s"] is not None
    assert result["targets_after_close_p99_s"] >= 0
    assert isinstance(result["keeps_up"], bool)
    assert result["cpu_us_per_event"] > 0 and result["raw_cpu_us_per_event"] > 0
    assert 20 < result["rss_mb_max"] < 4096
    assert result["achieved_rps"] > 0
