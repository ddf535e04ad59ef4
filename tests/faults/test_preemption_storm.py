"""A preemption storm: the whole opportunistic capacity is reclaimed within one second, under
load. Notices for each powerful replica, then for the powerful pool and the RMA pool, then
revokes; at the deadline the powerful replicas are killed (the hardware is gone).

Workers stop optional work on the notice without waiting for the control loop; clients fall
back to the baseline pool; the control plane's fast path cuts the targets. Baseline requests
are never rejected and their p99 stays within the SLA.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import decode, encode
from schemas.contract import CapacityEvent, ControlTargets, Event, PreemptionNotice
from schemas.kafka_config import KafkaSettings
from streams.control.config import RmaConfig
from tests.faults.conftest import Figures
from tests.faults.fleet import Fleet, figures_of
from tests.integration.fleet import POWERFUL_POOL, REGION, RMA_POOL, by_label, metric
from tests.integration.harness import TopicReader

pytestmark = [pytest.mark.kafka, pytest.mark.faults, pytest.mark.slow]

SLA_P99_MS = RmaConfig().sla_p99_ms
STORM_S = 1.0
# No extras on the provisioned replica's idle time: the load's samples cannot tell which replica
# scored an extra, and this test shows that losing the pool stops the optional work it carried.
STORM_CONTROL = "[sbm]\nmax_increase_per_period = 0.2\n[cost]\nprovisioned_utilisation = 0.0\n"


def _notice(pool: str, replicas: list[str], deadline_ms: int) -> PreemptionNotice:
    now = wall_ms()
    return PreemptionNotice(notice_id=f"storm-{pool}-{'-'.join(replicas) or 'all'}-{now}",
                            ts_ms=now, region=REGION, pool_id=pool, replicas=replicas,
                            deadline_ms=deadline_ms, accelerator="a100",
                            accelerator_units=8.0 if not replicas else 4.0)


def _revoke(pool: str) -> CapacityEvent:
    now = wall_ms()
    return CapacityEvent(event_id=f"revoke-{pool}-{now}", ts_ms=now, region=REGION, pool_id=pool,
                         kind="revoke", accelerator="a100")


def _reaction(samples: dict[str, float]) -> dict[str, float]:
    """Notices acted on and their mean notice -> optional-work-stopped time, from /metrics."""
    name = "surplus_worker_preemption_reaction_seconds"
    count = metric(samples, f"{name}_count")
    return {"preemptions": metric(samples, "surplus_worker_preemptions_total"),
            "mean_reaction_ms": round(1000 * metric(samples, f"{name}_sum") / max(count, 1.0), 2)}


def test_preemption_storm_keeps_baseline_within_sla_with_no_rejection(
        kafka: KafkaSettings, tmp_path: Path, figures: Figures, stopping: list[Fleet]) -> None:
    reader = TopicReader(kafka, "targets")
    fleet = Fleet(tmp_path, kafka, baseline=1, powerful=2, rate_rps=50.0,
                  control_extra=STORM_CONTROL)
    stopping.append(fleet)
    fleet.start()
    load = fleet.runner
    warm = fleet.warm_up()
    time.sleep(4)
    reader.poll(0.2)
    seen_before = len(reader.messages)

    producer = kafka_clients.producer(kafka, **{"linger.ms": 0})  # connected before the storm
    producer.list_topics(timeout=10)
    storm_at, storm_wall = load.now(), time.time()
    deadline_ms = int(storm_wall * 1000 + STORM_S * 1000)
    sends: list[tuple[str, Callable[[], Event]]] = [  # stamped when sent
        ("preemption", lambda: _notice(POWERFUL_POOL, ["p1"], deadline_ms)),
        ("preemption", lambda: _notice(POWERFUL_POOL, ["p2"], deadline_ms)),
        ("preemption", lambda: _notice(POWERFUL_POOL, [], deadline_ms)),
        ("preemption", lambda: _notice(RMA_POOL, [], deadline_ms)),
        ("capacity", lambda: _revoke(POWERFUL_POOL)), ("capacity", lambda: _revoke(RMA_POOL))]
    rma_notice_at = storm_at
    for i, (topic, make) in enumerate(sends):
        time.sleep(max(0.0, storm_at + i * STORM_S / len(sends) - load.now()))
        if i == 3:
            rma_notice_at = load.now()
        producer.produce(kafka.topic(topic), key=REGION, value=encode(make()))
        producer.flush(5)
    powerful = {w.name: w.metrics() for w in fleet.powerful_workers()}
    time.sleep(max(0.0, storm_at + STORM_S - load.now()))
    for worker in fleet.powerful_workers():  # reclaimed at the deadline
        worker.kill()
    killed_at = load.now()
    time.sleep(6)
    fleet.assert_alive(*fleet.powerful_workers())
    b1 = fleet.workers["b1"].metrics()
    reader.poll(0.5)
    fleet.stop()

    fast_path = [(m.timestamp()[1] / 1000.0 - storm_wall, decode(ControlTargets, m.value()))
                 for m in reader.messages[seen_before:]]
    fast_path = [(dt, t) for dt, t in fast_path if t.reason == "preemption"]
    reader.close()
    rma_after = [s.t for s in load.samples if s.t >= rma_notice_at and s.optional_scored > 0
                 and s.model == "baseline"]
    routed_after = [s.t for s in load.samples if s.t >= storm_at and s.routed == "powerful"]
    reactions = {name: _reaction(m) for name, m in powerful.items()}
    storm = load.window(storm_at, storm_at + 5.0)
    whole = load.window(warm)
    figures.add("before", figures_of(load.window(warm, storm_at)))
    figures.add("storm + 4 s", figures_of(storm))
    figures.add("after", figures_of(load.window(storm_at + 5.0)))
    figures.add("powerful replicas: notice -> optional work stopped", reactions)
    figures.add("control plane fast-path targets after storm start s",
                [round(dt, 3) for dt, _ in fast_path][:4])
    figures.add("RMA extras last scored after the RMA pool notice s",
                round(max(rma_after) - rma_notice_at, 2) if rma_after else "none after it")
    figures.add("requests last routed to the powerful pool after storm start s",
                round(max(routed_after) - storm_at, 2) if routed_after else "none after it")
    figures.add("worker b1 requests by outcome",
                by_label(b1, "surplus_worker_requests_total", "outcome"))

    assert whole.lost == {} and whole.served == whole.sent, whole.lost
    assert storm.baseline_p99_ms <= SLA_P99_MS, storm.baseline_p99_ms
    outcomes = by_label(b1, "surplus_worker_requests_total", "outcome")
    assert set(outcomes) == {"ok"}, outcomes  # nothing refused, not ready or failed
    for name, r in reactions.items():
        assert r["preemptions"] >= 1, name
    # The fast path cut the targets once all capacity was gone, without waiting for a tick.
    last_cut = fast_path[-1][1] if fast_path else None
    assert last_cut is not None and last_cut.rma.extra_candidates == 0, fast_path[-1:]
    assert last_cut.sbm.coverage == 0.0
    # Optional work stopped: nothing served by the powerful pool once it is gone, and no RMA
    # extras a few seconds after their capacity was reclaimed.
    assert load.window(killed_at).served_powerful == 0
    assert not rma_after or max(rma_after) - rma_notice_at < 3.0
    assert not routed_after or max(routed_after) - storm_at < 3.0
