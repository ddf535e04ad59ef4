"""The preemption benchmark's direct path alone: a real worker and its real HTTP server under
load, notices posted to ``/v1/preempt``, no broker."""

from __future__ import annotations

import json


def test_preemption_benchmark_measures_the_direct_path_alone_without_a_broker() -> None:
    """``--no-kafka``: for a machine with an accelerator and no Java, the worker's reaction
    to ``POST /v1/preempt`` under the same load, with no Kafka key in the result."""
    from bench.preemption import run

    result = run(notices=10, gap_ms=5.0, load_rps=50.0, kafka=False)
    print(json.dumps(result))
    assert result["kafka"] is False and result["device"] == "cpu"
    direct = result["direct_notice_to_shed_ms"]
    assert 0 < direct["p50"] <= direct["p99"] <= direct["max"]
    assert "notice_to_shed_p99_ms" not in result
    assert result["load_requests"] > 0
