"""A running worker on a real broker: it applies targets from the compacted topic, stops optional
work on a preemption notice (and measures how fast), reports telemetry, and dead-letters
garbage with its source offset."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import pytest

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import decode, encode
from schemas.contract import DeadLetter, WindowReport
from schemas.kafka_config import KafkaSettings
from tests.integration.worker_support import (
    JSON_BODY,
    body,
    notice,
    running_worker,
    targets,
    tiny_config,
)
from workers.api import RANK_PATH
from workers.runtime.config import WorkerConfig
from workers.runtime.worker import Worker

pytestmark = pytest.mark.kafka


def kafka_config(kafka: KafkaSettings, **overrides: object) -> WorkerConfig:
    return tiny_config(kafka={"bootstrap": kafka.bootstrap, "prefix": kafka.prefix},
                       report_interval_s=0.2, **overrides)


def produce(kafka: KafkaSettings, logical: str, key: str, value: bytes) -> tuple[int, int]:
    """Produce one message; its (partition, offset)."""
    where: list[tuple[int, int]] = []
    producer = kafka_clients.producer(kafka, **{"linger.ms": 0})
    producer.produce(kafka.topic(logical), key=key, value=value,
                     on_delivery=lambda err, msg: where.append((int(msg.partition() or 0),
                                                               int(msg.offset() or 0))))
    assert producer.flush(10) == 0
    return where[0]


async def eventually(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def read_topic(kafka: KafkaSettings, logical: str, want: Callable[[bytes], bool],
               timeout_s: float = 20.0) -> bytes:
    from tests.integration.harness import TopicReader

    reader = TopicReader(kafka, logical)
    try:
        msg = reader.wait_for(lambda m: want(m.value()), timeout_s)
    finally:
        reader.close()
    assert msg is not None, f"nothing wanted on {logical} within {timeout_s}s"
    return bytes(msg.value())


async def test_targets_on_the_topic_are_read_from_the_beginning_and_followed(
        kafka: KafkaSettings) -> None:
    # Written before the worker starts: it must read the compacted topic from its beginning.
    produce(kafka, "targets", "eu1", encode(targets(epoch=3, extra=1)))
    produce(kafka, "targets", "us2", encode(targets(epoch=9, region="us2")))
    async with running_worker(kafka_config(kafka, readiness_timeout_s=60.0)) as (worker, client):
        await eventually(lambda: worker.readiness()[0])
        assert worker.readiness()[1]["kafka"]["targets"] == "caught_up"
        assert worker.current_targets().epoch == 3  # us2's targets are not ours
        resp = await (await client.post(RANK_PATH, headers=JSON_BODY, data=body(2, 3))).json()
        assert resp["optional_scored"] == 1 and resp["shed_reason"] == "over_target"
        # ...and followed while running.
        produce(kafka, "targets", "eu1", encode(targets(epoch=4, extra=3)))
        await eventually(lambda: worker.current_targets().epoch == 4)
        resp = await (await client.post(RANK_PATH, headers=JSON_BODY, data=body(2, 3))).json()
        assert resp["optional_scored"] == 3


async def following_notices(worker: Worker) -> None:
    """Until the worker holds the targets of epoch 1 and reads the preemption topic."""
    await eventually(lambda: worker.current_targets().epoch == 1)
    await eventually(lambda: bool(worker.kafka and
                                  worker.kafka.readiness()[1]["preemption_partitions"]))


async def test_preemption_notice_stops_optional_work_and_the_reaction_is_measured(
        kafka: KafkaSettings) -> None:
    produce(kafka, "targets", "eu1", encode(targets(epoch=1)))
    async with running_worker(kafka_config(kafka)) as (worker, client):
        await following_notices(worker)
        stopped: list[tuple[int, int]] = []
        worker.preemption_listeners.append(
            lambda n, ns: stopped.append((n.ts_ms, wall_ms())))
        assert (await (await client.post(RANK_PATH, headers=JSON_BODY, data=body(2, 2))).json())[
            "optional_scored"] == 2
        reactions = []
        for i in range(5):
            produce(kafka, "preemption", "eu1", encode(notice(
                worker.config.pool, replicas=["w1", "w2"], notice_id=f"n{i}")))
            await eventually(lambda i=i: len(stopped) == i + 1)  # type: ignore[misc]
            reactions.append(stopped[-1][1] - stopped[-1][0])
        assert worker.admission.preempted and worker.targets.preempted
        resp = await (await client.post(RANK_PATH, headers=JSON_BODY, data=body(2, 2))).json()
        assert resp["scored"] == 2 and resp["shed_reason"] == "preemption"
        metrics = await (await client.get("/metrics")).text()
        assert "surplus_worker_preemption_reaction_seconds_count 5.0" in metrics
        assert "surplus_worker_preemption_delivery_seconds_count 5.0" in metrics
        print(json.dumps({"preemption_reaction_ms_wall_clock": reactions}))


async def test_a_zero_notice_reclaim_on_the_topic_stops_optional_work_and_an_old_one_is_stale(
        kafka: KafkaSettings) -> None:
    produce(kafka, "targets", "eu1", encode(targets(epoch=1)))
    async with running_worker(kafka_config(kafka)) as (worker, client):
        await following_notices(worker)
        outcomes = worker.metrics.kafka_messages
        # Issued before this replica started (read back after a restart): stale, no effect.
        produce(kafka, "preemption", "eu1", encode(notice(
            worker.config.pool, notice_id="old", ts_ms=wall_ms() - 60_000,
            deadline_in_ms=30_000)))
        await eventually(lambda: outcomes.labels("preemption", "stale")._value.get() == 1)
        assert (await (await client.post(RANK_PATH, headers=JSON_BODY, data=body(2, 2))).json())[
            "optional_scored"] == 2
        # Zero notice (the deadline is the notice's own time, as kcat would send a hardware
        # failure): optional work stops when it arrives, though its deadline has passed.
        produce(kafka, "preemption", "eu1", encode(notice(
            worker.config.pool, notice_id="now", deadline_in_ms=0)))
        await eventually(lambda: worker.admission.preempted)
        resp = await (await client.post(RANK_PATH, headers=JSON_BODY, data=body(2, 2))).json()
        assert resp["scored"] == 2 and resp["shed_reason"] == "preemption"
        assert outcomes.labels("preemption", "applied")._value.get() == 1


@pytest.mark.parametrize(("telemetry_key", "key"), [("scope", "eu1"), ("replica", "w1")])
async def test_window_reports_appear_on_the_telemetry_topic_under_their_key(
        kafka: KafkaSettings, telemetry_key: str, key: str) -> None:
    from tests.integration.harness import TopicReader

    async with running_worker(kafka_config(kafka, telemetry_key=telemetry_key)) as (_, client):
        for i in range(3):
            answer = await client.post(RANK_PATH, headers=JSON_BODY,
                                       data=body(2, 1, request_id=f"r{i}"))
            assert answer.status == 200
        reader = TopicReader(kafka, "telemetry")
        try:
            msg = await asyncio.to_thread(
                reader.wait_for, lambda m: decode(WindowReport, m.value()).requests > 0, 20.0)
        finally:
            reader.close()
    assert msg is not None, "no report with requests on the telemetry topic within 20 s"
    report = decode(WindowReport, msg.value())
    assert msg.key() == key.encode()  # by region; by replica for a two-stage control plane
    assert report.pool_id == "eu1/rank/baseline/cpu/baseline" and report.worker_id == "w1"
    assert report.requests == 3 and report.baseline_requests == 3
    assert report.optional_units_shed == {"stale_targets": 3}
    assert report.latency_ms.count == 3 and report.capacity_rps > 0


async def test_garbage_targets_go_to_the_deadletter_topic_with_reason_and_offset(
        kafka: KafkaSettings) -> None:
    async with running_worker(kafka_config(kafka)) as (worker, _):
        partition, offset = produce(kafka, "targets", "eu1", b'{"scope": "eu1", "epoch": -1}')
        letter = decode(DeadLetter, await asyncio.to_thread(
            read_topic, kafka, "deadletter", lambda v: b"targets" in v))
        assert worker.current_targets().baseline_only
    assert letter.source_topic == kafka.topic("targets")
    assert (letter.partition, letter.offset) == (partition, offset)
    assert letter.reason == "ControlTargets: Expected `int` >= 0 - at `$.epoch`"
    assert letter.key_b64 == "ZXUx"  # "eu1"


async def test_without_reachable_brokers_baseline_is_served_and_the_outage_counted() -> None:
    config = tiny_config(kafka={"bootstrap": "127.0.0.1:9"}, readiness_timeout_s=0.5)
    async with running_worker(config) as (worker, client):
        worker_ref: Worker = worker
        for _ in range(3):
            resp = await client.post(RANK_PATH, headers=JSON_BODY, data=body(3, 2))
            assert resp.status == 200 and (await resp.json())["scored"] == 3
        await eventually(lambda: worker_ref.readiness()[0], timeout_s=10)
        assert worker.readiness()[1]["kafka"]["targets"] == "gave_up"
        await eventually(lambda: worker_ref.kafka is not None and
                         worker_ref.readiness()[1]["kafka"]["outages"] >= 1, timeout_s=20)
        metrics = await (await client.get("/metrics")).text()
        assert "surplus_worker_kafka_outages_total 1.0" in metrics


def test_preemption_benchmark_measures_the_worker_against_a_raw_consumer(
        kafka: KafkaSettings) -> None:
    from bench.preemption import run

    result = run(bootstrap=kafka.bootstrap, notices=20, warmup=5, gap_ms=5.0, load_rps=50.0)
    print(json.dumps(result))
    assert result["lost_by_worker"] == 0 and result["lost_by_raw"] == 0
    worker, raw = result["notice_to_optional_stopped_ms"], result["raw_consumer_receive_ms"]
    assert 0 < worker["p50"] <= worker["p99"] <= worker["max"]
    assert 0 < raw["p50"] <= raw["p99"]
    direct = result["direct_notice_to_shed_ms"]        # the same notices by POST /v1/preempt
    assert 0 < direct["p50"] <= direct["p99"] <= direct["max"]
    assert result["direct_vs_kafka_p99"] > 0
    assert result["load_requests"] > 0
