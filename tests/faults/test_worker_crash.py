"""Workers killed with SIGKILL while requests sit in their batches.

A baseline replica dies with requests in flight: the client loses the connection, retries
those on the other baseline replica (scoring has no side effects) and counts every retry, so
no baseline request is lost; later requests skip the dead replica. Then a powerful
(opportunistic) replica dies: requests routed to it fall back to the baseline pool within
their deadline.

The killed replicas batch with a long window (100 ms) so that the kill lands mid-batch: the
test waits until a scrape shows requests in flight there, then kills at once. The baseline
replica goes first, so that fallbacks from the powerful one land on the fast replica left and
their time is the powerful call's plus a normal baseline call (with the slow baseline replica
still up, the two 100 ms waits alone took most of the 250 ms deadline, and overran it once).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from schemas.kafka_config import KafkaSettings
from tests.faults.conftest import Figures
from tests.faults.fleet import Fleet, figures_of
from tests.integration.fleet import WorkerProc, metric

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.slow]

SLOW_BATCH: dict[str, object] = {"max_wait_ms": 100.0}
DEADLINE_MS = 250.0


def _kill_mid_batch(worker: WorkerProc, now: Callable[[], float],
                    timeout_s: float = 20.0) -> tuple[float, float]:
    """SIGKILL `worker` right after it reports requests in flight; returns how many it had and
    the load's clock at the kill."""
    deadline = time.monotonic() + timeout_s
    in_flight = 0.0
    while time.monotonic() < deadline:
        in_flight = metric(worker.metrics(), "surplus_worker_in_flight_requests")
        if in_flight >= 1:
            break
        time.sleep(0.01)  # scraping shares the GIL with the load runner's thread: not too often
    worker.kill()
    return in_flight, now()


def test_workers_killed_mid_batch_lose_no_baseline_request(
        kafka: KafkaSettings, tmp_path: Path, figures: Figures, stopping: list[Fleet]) -> None:
    fleet = Fleet(tmp_path, kafka, baseline=2, powerful=1, rate_rps=50.0,
                  deadline_ms=DEADLINE_MS,
                  worker_overrides={"b2": SLOW_BATCH, "p1": SLOW_BATCH},
                  control_extra="[sbm]\nmax_increase_per_period = 0.2\n")
    stopping.append(fleet)
    fleet.start()
    load = fleet.runner
    warm = fleet.warm_up(rma=False)
    time.sleep(3)

    b2_in_flight, b2_at = _kill_mid_batch(fleet.workers["b2"], load.now)
    time.sleep(4)
    p1_in_flight, p1_at = _kill_mid_batch(fleet.workers["p1"], load.now)
    time.sleep(5)
    fleet.assert_alive(fleet.workers["p1"], fleet.workers["b2"])
    summary = load.client_summary()
    fleet.stop()

    decisions = summary["decisions"]
    retries = decisions.get("baseline_retry", {})
    after_b2 = load.window(b2_at, p1_at)
    after_p1 = load.window(p1_at)
    whole = load.window(warm)
    figures.add("before", figures_of(load.window(warm, b2_at)))
    figures.add("baseline replica b2 killed", figures_of(after_b2))
    figures.add("powerful replica p1 killed", figures_of(after_p1))
    figures.add("in flight at kill (worker's own gauge)", {"p1": p1_in_flight,
                                                            "b2": b2_in_flight})
    figures.add("client fallbacks / baseline retries / baseline lost",
                {"fallback": decisions.get("fallback", {}), "baseline_retry": retries,
                 "baseline_failed": decisions.get("baseline_failed", {})})
    figures.add("slowest fallback ms (deadline 250)", round(whole.fallback_max_ms, 1))

    # No baseline request lost: the ones in flight on b2 were retried, and counted. A request
    # in flight at a kill -9 fails as "disconnected" when the kernel closes its connection
    # with a FIN, and as "connection" (reset) when the dead process left unread bytes in it:
    # one CI run counted only {"connection": 9}. Either is a retry; a request that was not
    # retried would be lost, which the first assertion catches.
    assert whole.lost == {} and whole.served == whole.sent, whole.lost
    went_away = retries.get("disconnected", 0) + retries.get("connection", 0)
    assert b2_in_flight >= 1 and went_away >= 1, retries
    assert "baseline_failed" not in decisions
    # The powerful replica's requests fell back to baseline within their deadline (the one in
    # flight at the kill was sent before it: the client's own count has it).
    assert sum(decisions.get("fallback", {}).values()) >= 1, decisions
    assert after_p1.served_powerful == 0
    assert whole.fallback_max_ms <= DEADLINE_MS
    # The dead baseline replica is skipped: a retry or two per second of it being gone (4-9
    # in 5 s measured), where without the skip half of all requests would meet it.
    gone = load.window(b2_at)
    assert retries.get("connection", 0) <= 3 * (gone.seconds + 1), (retries, gone.sent)
