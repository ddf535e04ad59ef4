"""Every event type crosses a real broker with both clients, key and partition intact."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from schemas import kafka_clients
from schemas.codec import decode, encode
from schemas.contract import WindowPartial
from schemas.kafka_clients import ConfigResource
from schemas.kafka_config import KafkaSettings
from schemas.topics import BY_LOGICAL
from tests.unit.schemas.samples import SAMPLES

pytestmark = pytest.mark.kafka

LOGICAL_OF = {spec.value_type: logical for logical, spec in BY_LOGICAL.items()}
#: Types that travel on a topic of the control plane's own (`<prefix><app-id>-...`), which
#: these tests create as the plane does: the two-stage plane's parts.
OWN_TOPIC = {WindowPartial: "surplus-control-partials"}


def _topic(kafka: KafkaSettings, event: Any) -> str:
    own = OWN_TOPIC.get(type(event))
    return f"{kafka.prefix}{own}" if own else kafka.topic(LOGICAL_OF[type(event)])


@pytest.fixture(autouse=True)
def _own_topics(kafka: KafkaSettings) -> None:
    from surplus.topics import create_topics

    create_topics(kafka_clients.admin(kafka),
                  [kafka_clients.NewTopic(f"{kafka.prefix}{name}", num_partitions=2,
                                          replication_factor=1)
                   for name in OWN_TOPIC.values()], timeout_s=15.0)


def _consume_all(kafka: KafkaSettings, topics: list[str], expected: int) -> list[Any]:
    consumer = kafka_clients.consumer(kafka, "roundtrip", **{"auto.offset.reset": "earliest"})
    consumer.subscribe(topics)
    got = []
    try:
        for _ in range(300):
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                got.append(msg)
            if len(got) >= expected:
                break
    finally:
        consumer.close()
    return got


def test_confluent_kafka_round_trips_every_event_with_key_and_partition(
        kafka: KafkaSettings) -> None:
    producer = kafka_clients.producer(kafka)
    sent = {}
    for i, event in enumerate(SAMPLES):
        topic = _topic(kafka, event)
        producer.produce(topic, key=f"key-{i}", value=encode(event), partition=i % 2)
        sent[f"key-{i}"] = (topic, i % 2, event)
    assert producer.flush(10) == 0
    got = _consume_all(kafka, sorted({t for t, _, _ in sent.values()}), len(SAMPLES))
    assert len(got) == len(SAMPLES)
    for msg in got:
        topic, partition, event = sent[msg.key().decode()]
        assert (msg.topic(), msg.partition()) == (topic, partition)
        assert decode(type(event), msg.value()) == event


def test_aiokafka_round_trips_every_event_with_key_and_partition(kafka: KafkaSettings) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
        await producer.start()
        sent = {}
        try:
            for i, event in enumerate(SAMPLES):
                topic = _topic(kafka, event)
                meta = await producer.send_and_wait(topic, key=f"k{i}".encode(),
                                                    value=encode(event), partition=1 - i % 2)
                sent[f"k{i}"] = (topic, meta.partition, event)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(*sorted({t for t, _, _ in sent.values()}),
                                    bootstrap_servers=kafka.bootstrap,
                                    auto_offset_reset="earliest", group_id="aio-roundtrip")
        await consumer.start()
        got: list[Any] = []
        try:
            async with asyncio.timeout(30):
                while len(got) < len(SAMPLES):
                    batch = await consumer.getmany(timeout_ms=500)
                    for records in batch.values():
                        got.extend(records)
        finally:
            await consumer.stop()
        for record in got:
            topic, partition, event = sent[record.key.decode()]
            assert (record.topic, record.partition) == (topic, partition)
            assert decode(type(event), record.value) == event

    asyncio.run(run())


def test_latest_value_topics_are_compacted_and_others_are_not(kafka: KafkaSettings) -> None:
    admin = kafka_clients.admin(kafka)
    resources = [ConfigResource(ConfigResource.Type.TOPIC, kafka.topic(name))
                 for name in BY_LOGICAL]
    policies = {res.name: fut.result(10)["cleanup.policy"].value
                for res, fut in admin.describe_configs(resources).items()}
    compacted = {kafka.topic(name) for name, spec in BY_LOGICAL.items()
                 if spec.cleanup_policy == "compact"}
    assert {kafka.topic("targets"), kafka.topic("overrides")} <= compacted
    assert policies == {name: "compact" if name in compacted else "delete" for name in policies}
