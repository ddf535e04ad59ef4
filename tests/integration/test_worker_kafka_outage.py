"""A worker whose broker goes away and comes back: baseline keeps being served, targets expire
to baseline only by their TTL, the outage is counted, and targets apply again on return.

Uses a broker of its own (the embedded one) so that it can be stopped and restarted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from schemas import kafka_clients
from schemas.codec import encode
from schemas.kafka_config import KafkaSettings
from surplus import localkafka
from tests.integration.worker_support import JSON_BODY, body, running_worker, targets, tiny_config
from workers.api import RANK_PATH

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def publish_targets(kafka: KafkaSettings, epoch: int, ttl_ms: int) -> None:
    producer = kafka_clients.producer(kafka, **{"linger.ms": 0})
    producer.produce(kafka.topic("targets"), key="eu1",
                     value=encode(targets(epoch=epoch, extra=4, ttl_ms=ttl_ms)))
    assert producer.flush(20) == 0


async def eventually(check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_outage_serves_baseline_expires_targets_and_recovers(
        own_broker: tuple[KafkaSettings, Path, int]) -> None:
    kafka, data_dir, port = own_broker
    publish_targets(kafka, epoch=1, ttl_ms=4_000)
    config = tiny_config(kafka={"bootstrap": kafka.bootstrap, "prefix": kafka.prefix},
                         report_interval_s=0.2)
    async with running_worker(config) as (worker, client):
        assert worker.kafka is not None
        io = worker.kafka
        await eventually(lambda: worker.current_targets().epoch == 1, 30)
        resp = await (await client.post(RANK_PATH, headers=JSON_BODY, data=body(2, 2))).json()
        assert resp["optional_scored"] == 2

        await asyncio.to_thread(localkafka.down, data_dir)
        await eventually(lambda: io.readiness()[1]["outages"] == 1, 30)
        for i in range(5):  # baseline never depends on Kafka
            resp = await (await client.post(RANK_PATH, headers=JSON_BODY,
                                            data=body(3, 2, seed=i))).json()
            assert resp["scored"] >= 3
        await eventually(lambda: worker.current_targets().baseline_only, 10)
        resp = await (await client.post(RANK_PATH, headers=JSON_BODY, data=body(3, 2))).json()
        assert resp["scored"] == 3 and resp["shed_reason"] == "stale_targets"
        metrics = await (await client.get("/metrics")).text()
        assert "surplus_worker_kafka_outages_total 1.0" in metrics
        assert "surplus_worker_kafka_up 0.0" in metrics

        await asyncio.to_thread(localkafka.up, port, data_dir)
        await asyncio.to_thread(publish_targets, kafka, 2, 60_000)
        await eventually(lambda: worker.current_targets().epoch == 2, 60)
        # Optional work resumes. On a loaded machine admission may trim the first request's
        # extras to its delay bound (the service time it measured while the CPU was busy),
        # so a few requests are allowed before both extras are scored.
        for attempt in range(50):
            resp = await (await client.post(RANK_PATH, headers=JSON_BODY,
                                            data=body(2, 2, seed=attempt))).json()
            if resp["optional_scored"] == 2:
                break
            await asyncio.sleep(0.1)
        assert resp["optional_scored"] == 2, resp
        await eventually(lambda: io.readiness()[1]["up"] is True, 30)
        assert io.readiness()[1]["outages"] == 1
