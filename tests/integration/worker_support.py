"""Helpers for worker tests: a tiny real model, request bodies, targets and notices."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from schemas.clock import wall_ms
from schemas.contract import ControlTargets, PreemptionNotice, RmaTarget, SbmTarget
from workers.api import Candidate, RankRequest, encode
from workers.runtime.config import WorkerConfig, load_config
from workers.runtime.models import ModelConfig
from workers.runtime.server import create_app, start_kafka
from workers.runtime.worker import Worker

TINY = ModelConfig(num_dense=4, num_sparse=3, rows_per_table=64, embedding_dim=4,
                   bottom_mlp=(8,), top_mlp=(8,), deep_mlp=(16,), cross_layers=1)


def tiny_config(**overrides: Any) -> WorkerConfig:
    """A worker config with the tiny model; ``overrides`` are dotted keys."""
    base: dict[str, Any] = {"worker_id": "w1", "model.config": {
        "num_dense": TINY.num_dense, "num_sparse": TINY.num_sparse,
        "rows_per_table": TINY.rows_per_table, "embedding_dim": TINY.embedding_dim,
        "bottom_mlp": list(TINY.bottom_mlp), "top_mlp": list(TINY.top_mlp),
        "deep_mlp": list(TINY.deep_mlp), "cross_layers": TINY.cross_layers},
        "model.device": "cpu", "model.threads": 1, "batching.max_wait_ms": 1.0}
    base.update(overrides)
    return load_config(None, base)


def rank_request(base: int, extra: int, request_id: str = "r1", value: float = 1.0,
                 deadline_ms: float = 5_000.0, seed: int = 0) -> RankRequest:
    rng = random.Random(seed)
    candidates = [Candidate(id=i, sparse=[rng.randrange(1 << 30) for _ in range(TINY.num_sparse)],
                            prior=rng.random()) for i in range(base + extra)]
    return RankRequest(request_id=request_id, segment="s1", value=value,
                       deadline_ms=deadline_ms, dense=[rng.random() for _ in range(TINY.num_dense)],
                       candidates=candidates, base_count=base)


#: A rank request's body is JSON: the worker reads a body by its declared content type (an
#: aiohttp client posting bytes declares application/octet-stream, which it refuses, 415).
JSON_BODY = {"Content-Type": "application/json"}


def body(base: int, extra: int, **kw: Any) -> bytes:
    return encode(rank_request(base, extra, **kw))


def targets(epoch: int, extra: int = 8, budget: float = 1e6, coverage: float = 0.5,
            region: str = "eu1", issued_at_ms: int | None = None,
            ttl_ms: int = 60_000) -> ControlTargets:
    return ControlTargets(scope=region, epoch=epoch,
                          issued_at_ms=wall_ms() if issued_at_ms is None else issued_at_ms,
                          ttl_ms=ttl_ms, rma=RmaTarget(extra_candidates=extra,
                                                       budget_units_per_s=budget),
                          sbm=SbmTarget(coverage=coverage))


def notice(pool_id: str, replicas: list[str] | None = None, notice_id: str = "n1",
           ts_ms: int | None = None, deadline_in_ms: int = 30_000) -> PreemptionNotice:
    ts = wall_ms() if ts_ms is None else ts_ms
    return PreemptionNotice(notice_id=notice_id, ts_ms=ts, region="eu1", pool_id=pool_id,
                            replicas=replicas or [], deadline_ms=ts + deadline_in_ms)


@asynccontextmanager
async def running_worker(config: WorkerConfig) -> AsyncIterator[tuple[Worker, TestClient]]:
    """A started worker behind a real aiohttp server on a loopback port, and a client."""
    worker = Worker(config)
    await worker.start()
    kafka = start_kafka(worker)
    client = TestClient(TestServer(create_app(worker), host="127.0.0.1"))
    await client.start_server()
    try:
        yield worker, client
    finally:
        await client.close()
        await worker.stop()
        if kafka is not None:
            await asyncio.to_thread(kafka.stop)
