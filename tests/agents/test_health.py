"""Control-plane probes: what makes it alive and ready, and their HTTP face beside /metrics."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from streams.agents.health import HealthState, liveness, readiness, serve
from surplus.localkafka import free_port

NOW = 1_700_000_000_000


def _state() -> HealthState:
    return HealthState(period_ms=1_000, tick_interval_ms=500.0)


def test_not_ready_until_assigned_restored_and_every_partition_ticked() -> None:
    state = _state()
    assert readiness(state, NOW) == [
        "no partition assignment from the consumer group yet (starting or rebalancing)"]
    state.on_assigned([0, 1], restoring=[1])
    reasons = readiness(state, NOW)
    assert any("partitions [1] from the changelog" in r for r in reasons)
    assert any(r.startswith("partition 0: no tick") for r in reasons)
    state.on_restored()
    state.on_tick(0, NOW)
    assert readiness(state, NOW) == ["partition 1: no tick handled since it was assigned"]
    state.on_tick(1, NOW)
    assert readiness(state, NOW) == []


def test_a_partition_whose_last_tick_is_older_than_two_periods_is_not_ready() -> None:
    state = _state()
    state.on_assigned([0], restoring=[])
    state.on_tick(0, NOW)
    assert readiness(state, NOW + 2_000) == []
    assert readiness(state, NOW + 2_001) == [
        "partition 0: last tick 2.0 s ago (more than two periods, 2 s)"]


def test_a_rebalance_is_not_ready_and_forgets_ticks_of_partitions_given_away() -> None:
    state = _state()
    state.on_assigned([0, 1], restoring=[])
    state.on_tick(0, NOW)
    state.on_tick(1, NOW)
    state.on_revoked()
    assert readiness(state, NOW) != []
    state.on_assigned([1], restoring=[])
    assert state.last_tick_ms == {1: NOW} and readiness(state, NOW) == []


def test_a_standby_without_partitions_is_ready() -> None:
    state = _state()
    state.on_assigned([], restoring=[])
    assert readiness(state, NOW) == []


def test_alive_while_starting_and_while_the_loop_turns_not_once_it_stalls() -> None:
    state = _state()
    assert liveness(state, NOW) == []  # before the app's loop first runs the timer
    state.on_beat(NOW)
    assert liveness(state, NOW + 30_000) == []
    assert liveness(state, NOW + 30_001)[0].startswith("event loop stalled")


def test_probes_answer_json_on_the_metrics_port_and_metrics_still_scrape() -> None:
    registry = CollectorRegistry()
    Counter("probe_test_total", "a series", registry=registry).inc()
    state = _state()
    port = free_port()
    server = serve("127.0.0.1", port, registry, state, lambda: NOW)
    try:
        base = f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as resp:
            assert resp.status == 200 and json.loads(resp.read())["status"] == "ok"
        try:
            urllib.request.urlopen(f"{base}/readyz", timeout=5)
            raise AssertionError("/readyz answered 200 before any assignment")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
            body = json.loads(exc.read())
            assert body["status"] == "not ready" and body["partitions"] is None
            assert "no partition assignment" in body["reasons"][0]
        state.on_assigned([0], restoring=[])
        state.on_tick(0, NOW)
        with urllib.request.urlopen(f"{base}/readyz", timeout=5) as resp:
            assert resp.status == 200 and json.loads(resp.read())["partitions"] == [0]
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
            assert "probe_test_total 1.0" in resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()
