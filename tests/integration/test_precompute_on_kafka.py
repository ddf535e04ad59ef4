"""The precompute lever on a real broker: two lent replicas share the jobs in one consumer
group and answer each on the cache topic under its key; a notice stops a replica mid-job, and
the job it held, never committed, is read again and answered by the other. None is lost."""

from __future__ import annotations

import asyncio
import threading
from contextlib import AsyncExitStack

import numpy as np
import pytest

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import encode
from schemas.kafka_clients import TopicPartition
from schemas.kafka_config import KafkaSettings
from schemas.precompute import PrecomputeJob, PrecomputeResult, group_id
from tests.integration.harness import TopicReader
from tests.integration.test_worker_on_kafka import eventually, produce
from tests.integration.worker_support import (
    notice,
    rank_request,
    running_worker,
    targets,
    tiny_config,
)
from workers.client.client import RankingClient
from workers.client.config import ClientConfig
from workers.policy.holdout import in_holdout
from workers.runtime.batching import Scorer
from workers.runtime.config import WorkerConfig
from workers.runtime.kafka_io import KafkaIO
from workers.runtime.precompute import PrecomputeRunner
from workers.runtime.worker import Worker
from workers.wire import encode_rank_request

pytestmark = pytest.mark.kafka


def lent(kafka: KafkaSettings, worker_id: str) -> WorkerConfig:
    """A lent replica that scores a job one row a slice (``chunk_ms`` under a row's cost),
    so a job of a few thousand candidates is still in service when the notice comes."""
    return tiny_config(kafka={"bootstrap": kafka.bootstrap, "prefix": kafka.prefix},
                       worker_id=worker_id, tier="opportunistic", report_interval_s=0.2,
                       precompute={"enabled": True, "chunk_ms": 0.001})


def job(key: str, candidates: int, seed: int = 0) -> bytes:
    now = wall_ms()
    body = encode_rank_request(rank_request(0, candidates, request_id=key, seed=seed),
                               "msgpack")
    return encode(PrecomputeJob(job_key=key, scope="eu1", segment="s1", model="baseline",
                                issued_at_ms=now, expires_at_ms=now + 600_000, body=body,
                                top=20))


class Held:
    """The worker's own model, which holds its ``after``-th pass until ``release`` is set: a
    job is in service when the notice comes however late a loaded machine delivers it (a
    millisecond a row raced a 4,000-row job against the notice's delivery, and once lost)."""

    def __init__(self, scorer: Scorer, after: int) -> None:
        self.scorer = scorer
        self.after = after
        self.passes = 0
        self.holding = threading.Event()
        self.release = threading.Event()

    def score(self, *inputs: np.ndarray) -> np.ndarray:
        self.passes += 1
        if self.passes == self.after:
            self.holding.set()
            self.release.wait(60)
        return self.scorer.score(*inputs)


def runner(worker: Worker) -> PrecomputeRunner:
    assert isinstance(worker.kafka, KafkaIO) and worker.kafka.precompute is not None
    return worker.kafka.precompute


def assigned(worker: Worker) -> list[int]:
    return list(runner(worker).snapshot()["partitions"])


def answers(reader: TopicReader) -> dict[str, list[PrecomputeResult]]:
    reader.poll(0.3)
    out: dict[str, list[PrecomputeResult]] = {}
    for result in reader.events(PrecomputeResult):
        out.setdefault(result.job_key, []).append(result)
    return out


async def test_jobs_are_answered_by_key_and_a_notice_hands_a_job_in_service_to_the_other(
        kafka: KafkaSettings) -> None:
    produce(kafka, "targets", "eu1", encode(targets(epoch=1, ttl_ms=600_000)))
    reader = TopicReader(kafka, "cache")
    async with AsyncExitStack() as stack:
        w1, _ = await stack.enter_async_context(running_worker(lent(kafka, "w1")))
        w2, _ = await stack.enter_async_context(running_worker(lent(kafka, "w2")))
        await eventually(lambda: len(assigned(w1)) == 1 and len(assigned(w2)) == 1, 60.0)

        producer = kafka_clients.producer(kafka, **{"linger.ms": 0})
        keys = [f"user-{i}" for i in range(20)]
        for i, key in enumerate(keys):
            producer.produce(kafka.topic("precompute"), key=key, value=job(key, 10, seed=i))
        assert producer.flush(10) == 0
        await eventually(lambda: set(keys) <= set(answers(reader)), 60.0)
        got = answers(reader)
        assert {r.worker_id for k in keys for r in got[k]} == {"w1", "w2"}  # shared
        for key in keys:
            (result,) = got[key]
            assert result.candidates == 10 and len(result.top_ids) == 10
            assert result.top_scores == sorted(result.top_scores, reverse=True)
        # their telemetry says so (v13): the share of a window its slices took, which the
        # control plane sets the lever's share from (the publisher may have read it first)
        for worker in (w1, w2):
            report = worker.window_report()
            assert report.v == 13 and 0.0 <= report.precompute_utilisation <= 1.0  # type: ignore[operator]
            assert runner(worker).busy_s > 0.0

        # A big job on w1's partition, which w1 scores a row a slice; its 50th slice is held
        # in service until the notice has stopped the lever.
        (partition,) = assigned(w1)
        held = Held(w1.batcher.scorer, after=50)
        w1.batcher.scorer = held
        producer.produce(kafka.topic("precompute"), key=b"big", value=job("big", 4000),
                         partition=partition)
        assert producer.flush(10) == 0
        await asyncio.to_thread(held.holding.wait, 60)
        answered_before = runner(w1).counts.get("answered", 0)
        produce(kafka, "preemption", "eu1",
                encode(notice(w1.config.pool, replicas=["w1"], notice_id="n-big")))
        await eventually(lambda: not runner(w1).snapshot()["allowed"], 60.0)
        held.release.set()  # the slice in service ends: it must not be answered
        await eventually(lambda: "big" in answers(reader), 60.0)
        (big,) = answers(reader)["big"]
        assert big.worker_id == "w2" and big.candidates == 4000
        assert runner(w1).counts.get("answered", 0) == answered_before
        assert not runner(w1).snapshot()["allowed"] and runner(w1)._consumer is None
        # its stop is measured once, at the end of the slice in service, from the notice's stamp
        stops = w1.metrics.registry.get_sample_value("surplus_worker_precompute_stop_seconds_count")
        assert stops == 1.0

        # Every job is committed by the group: none is left to be read again.
        def committed() -> bool:
            probe = kafka_clients.consumer(kafka, group_id(kafka.prefix, "eu1", "baseline"))
            try:
                topic = kafka.topic("precompute")
                offsets = probe.committed([TopicPartition(topic, p) for p in (0, 1)], 10)
                ends = [probe.get_watermark_offsets(TopicPartition(topic, p), 10)[1]
                        for p in (0, 1)]
                return [tp.offset for tp in offsets] == ends
            finally:
                probe.close()

        await eventually(committed, 30.0)
    reader.close()


async def test_a_client_asks_for_jobs_and_uses_each_answer_until_it_expires(
        kafka: KafkaSettings) -> None:
    produce(kafka, "targets", "eu1", encode(targets(epoch=1, ttl_ms=600_000)))
    config = ClientConfig(scope="eu1", baseline_urls=["http://127.0.0.1:9"], precompute=True)
    async with (running_worker(lent(kafka, "w1")) as (worker, _),
                RankingClient(config, kafka) as client):
        side = client.precompute
        assert side is not None
        await eventually(lambda: len(assigned(worker)) == 2, 60.0)
        request = rank_request(0, 30, seed=7)
        side.ask("user-a", segment="s1", model="baseline", candidates=request.candidates,
                 dense=request.dense, ttl_ms=2_000, top=5)
        side.ask("user-b", segment="s1", model="baseline", candidates=request.candidates,
                 dense=request.dense, ttl_ms=600_000, top=5)
        client.flush_decisions()
        await eventually(lambda: len(side.answers) == 2, 60.0)
        a, b = side.answer("user-a"), side.answer("user-b")
        assert a is not None and b is not None
        assert a.top_ids == b.top_ids and len(a.top_ids) == 5  # the same rows, the same answer
        assert side.answer("user-c") is None
        held_out = next(f"r{i}" for i in range(10_000) if in_holdout(f"r{i}", 0.01))
        assert side.answer("user-b", held_out) is None  # a holdout request uses none
        treated = next(f"r{i}" for i in range(10_000) if not in_holdout(f"r{i}", 0.01))
        assert side.answer("user-b", treated) is not None
        await eventually(lambda: side.answer("user-a") is None, 10.0)  # expired
        assert side.answer("user-b") is not None
        summary = client.summary()["precompute"]
        assert summary["asked"] == 2 and summary["answers"]["miss"] == 1
