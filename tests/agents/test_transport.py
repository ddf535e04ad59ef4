"""The control plane's Kafka transport, against the real broker."""

from __future__ import annotations

import asyncio

import faust
import pytest

from schemas import kafka_clients
from schemas.kafka_clients import NewTopic
from schemas.kafka_config import KafkaSettings
from streams.app import broker_kwargs
from tests.agents.support import producing

pytestmark = pytest.mark.kafka


async def test_a_queued_send_survives_the_producer_learning_of_a_new_topic(
        kafka: KafkaSettings) -> None:
    """A batch waiting in the producer for a topic known from the start-up metadata must still
    go out after the producer starts writing to a topic created later. aiokafka tracks only the
    topics it had to look up; the new topic narrows its metadata to that topic, and a batch
    for an untracked one then never finds its leader (the control plane's dead letters hung
    behind its first changelog write this way)."""
    app = faust.App(f"{kafka.prefix}transport", **broker_kwargs(kafka), web_enabled=False,
                    producer_linger=0.5)  # holds the first batch while the topic list changes
    async with producing(app):
        # Declaring a topic, as the control plane does with its changelog at start, refreshes
        # the producer's metadata for every topic: `known` is then found without being tracked.
        await app.producer.create_topic(f"{kafka.prefix}declared", partitions=1, replication=1)
        known = kafka.topic("deadletter")
        late = f"{kafka.prefix}created-after-start"
        admin = kafka_clients.admin(kafka)
        admin.create_topics([NewTopic(late, num_partitions=1, replication_factor=1)])[late] \
            .result(timeout=30)
        waiting = await app.producer.send(known, b"k", b"queued", partition=0,
                                          timestamp=None, headers=None)
        await asyncio.wait_for(
            await app.producer.send(late, b"k", b"new", partition=0, timestamp=None,
                                    headers=None), timeout=30)
        metadata = await asyncio.wait_for(waiting, timeout=30)
        assert metadata.topic == known
