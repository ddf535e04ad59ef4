"""The ranking client on a real broker: it reads the latest targets of its scope from the
compacted topic at start, follows new ones, dead-letters what does not decode, and publishes a
decision record per request keyed by scope, in batches, and labels keyed by request id."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import decode, decode_outcomes, encode
from schemas.contract import DeadLetter, Event, OutcomeLabel
from schemas.kafka_clients import OFFSET_BEGINNING
from schemas.kafka_config import KafkaSettings
from tests.unit.client.contract_worker import Worker, serve
from tests.unit.policy.helpers import targets
from workers.api import Candidate
from workers.client.client import RankingClient
from workers.client.config import ClientConfig

pytestmark = pytest.mark.kafka


def _publish(kafka: KafkaSettings, items: list[tuple[str, bytes]]) -> None:
    producer = kafka_clients.producer(kafka)
    for key, value in items:
        producer.produce(kafka.topic("targets"), key=key, value=value)
    assert producer.flush(10) == 0


def _read_all(kafka: KafkaSettings, logical: str,
              expected: int) -> list[tuple[bytes | None, bytes]]:
    consumer = kafka_clients.consumer(kafka, f"read-{logical}", **{"enable.auto.commit": False})
    topic = kafka.topic(logical)
    parts = kafka_clients.partitions(consumer, topic, timeout_s=10)
    consumer.assign(kafka_clients.starting_at(topic, parts, OFFSET_BEGINNING))
    got: list[tuple[bytes | None, bytes]] = []
    deadline = time.monotonic() + 20
    try:
        while len(got) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None and msg.value() is not None:
                got.append((msg.key(), msg.value() or b""))
        while (msg := consumer.poll(0.5)) is not None:   # and any after the first ones
            if msg.error() is None and msg.value() is not None:
                got.append((msg.key(), msg.value() or b""))
    finally:
        consumer.close()
    return got


async def _until(check: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def _ev(event: Event) -> bytes:
    return encode(event)


async def test_client_starts_from_latest_target_of_its_scope_and_follows(
        kafka: KafkaSettings) -> None:
    now = wall_ms()
    _publish(kafka, [("eu1", _ev(targets(epoch=1, coverage=0.1, issued_at_ms=now))),
                     ("us1", _ev(targets(scope="us1", epoch=9, coverage=0.9, issued_at_ms=now))),
                     ("eu1", _ev(targets(epoch=2, coverage=0.5, issued_at_ms=now))),
                     ("eu1", b'{"not": "targets"}')])
    config = ClientConfig(scope="eu1", baseline_urls=["http://127.0.0.1:9"],
                          catch_up_timeout_s=30.0)
    async with RankingClient(config, kafka) as client:
        summary = client.summary()
        assert summary["effective"]["epoch"] == 2
        assert summary["effective"]["coverage"] == 0.5
        assert summary["feed"] == {"received": 2, "other_scope": 1, "decode_error": 1}
        assert summary["targets"] == {"applied": 2}
        _publish(kafka, [("eu1", _ev(targets(epoch=3, coverage=0.7, issued_at_ms=wall_ms())))])
        await _until(lambda: client.summary()["effective"]["epoch"] == 3)
    letters = [decode(DeadLetter, v) for _, v in _read_all(kafka, "deadletter", 1)]
    assert len(letters) == 1
    assert letters[0].source_topic == kafka.topic("targets") and letters[0].offset >= 0
    assert "ControlTargets" in letters[0].reason


async def test_stale_target_on_the_topic_leaves_the_client_baseline_only(
        kafka: KafkaSettings) -> None:
    _publish(kafka, [("eu1", _ev(targets(epoch=5, issued_at_ms=wall_ms() - 120_000,
                                         ttl_ms=60_000)))])
    config = ClientConfig(scope="eu1", baseline_urls=["http://127.0.0.1:9"],
                          catch_up_timeout_s=30.0)
    async with RankingClient(config, kafka) as client:
        summary = client.summary()
    assert summary["effective"]["baseline_only"] and summary["targets"] == {"expired": 1}


async def test_every_request_publishes_an_outcome_keyed_by_scope(kafka: KafkaSettings) -> None:
    baseline, powerful = Worker("baseline"), Worker("powerful")
    servers = [await serve(baseline), await serve(powerful)]
    urls = [str(s.make_url("")).rstrip("/") for s in servers]
    _publish(kafka, [("eu1", _ev(targets(epoch=1, coverage=0.5, issued_at_ms=wall_ms())))])
    config = ClientConfig(scope="eu1", baseline_urls=[urls[0]], powerful_urls=[urls[1]],
                          catch_up_timeout_s=30.0)
    candidates = [Candidate(id=i, prior=i / 10) for i in range(7)]   # 2 beyond the base
    try:
        async with RankingClient(config, kafka) as client:
            results = [await client.rank(segment=f"s{i % 3}", value=1.0,
                                         candidates=candidates, base_count=5,
                                         request_id=f"r{i}") for i in range(40)]
            client.label("r3", 2.5)
    finally:
        for s in servers:
            await s.close()
    assert {r.response.model for r in results} == {"baseline", "powerful"}
    got = _read_all(kafka, "outcomes", 1)
    assert {k for k, _ in got} == {b"eu1"}
    # batched: the 40 decision records went out in far fewer messages
    outcomes = {o.request_id: o for _, v in got for o in decode_outcomes(v)}
    assert len(got) < 10 and set(outcomes) == {f"r{i}" for i in range(40)}, len(got)
    for i, r in enumerate(results):
        o = outcomes[f"r{i}"]
        assert (o.segment, o.model, o.value) == (f"s{i % 3}", r.response.model, None)
        assert 0.0 < o.propensity <= 1.0 and o.holdout == r.decision.holdout
        assert (o.v, o.available) == (6, 2)      # what the caller offered, sent or not
        assert o.extra == (r.response.optional_scored if r.fell_back is None else 0)  # scored
        if r.fell_back is None:
            assert o.propensity == r.decision.propensity
    assert client.summary()["decisions"]["outcomes"]["published"] == 40
    labels = _read_all(kafka, "labels", 1)
    assert [(k, decode(OutcomeLabel, v).value) for k, v in labels] == [(b"r3", 2.5)]
