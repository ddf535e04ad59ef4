"""Membership on a real broker: a worker announces itself once it serves and a client routes to
it; a notice for it takes it out of the client's routing set at once (draining, long before the
deadline); a clean stop leaves a tombstone; a replica killed with -9 leaves the set when its
lease runs out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from schemas.codec import decode
from schemas.contract import ReplicaAnnouncement
from schemas.kafka_config import KafkaSettings
from tests.integration.fleet import NUM_DENSE, NUM_SPARSE, WorkerProc
from tests.integration.harness import TopicReader, publish
from tests.integration.worker_support import notice, running_worker, tiny_config
from workers.api import Candidate
from workers.client.client import RankingClient
from workers.client.config import ClientConfig
from workers.policy.membership import Membership
from workers.runtime.worker import Worker

pytestmark = pytest.mark.kafka

POOL = "eu1/rank/baseline/cpu/opportunistic"


async def _until(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``check()`` holds (fails naming ``what`` after ``timeout_s``)."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s}s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def _client(kafka: KafkaSettings) -> RankingClient:
    return RankingClient(ClientConfig(scope="eu1", membership=True, publish_outcomes=False,
                                      catch_up_timeout_s=10.0), kafka)


async def _routed(worker: Worker, http: TestClient, client: RankingClient) -> Membership:
    """Give the in-process worker its URL, start the client, wait until it routes there."""
    worker.endpoint = str(http.make_url("")).rstrip("/")
    await client.start()
    membership = client.membership
    assert membership is not None
    await _until(lambda: membership.routable("baseline", client._clock()) ==
                 (worker.endpoint,), 15.0, "the client routes to the announced worker")
    return membership


def _states(reader: TopicReader, replica: str) -> list[str | None]:
    """The replica's announcements in order: their state, None for a tombstone."""
    return [None if m.value() is None else decode(ReplicaAnnouncement, m.value()).state
            for m in reader.messages if m.key() == replica.encode()]


async def test_an_announced_worker_is_routed_to_until_a_notice_drains_it_then_its_stop_leaves_a_tombstone(  # noqa: E501
        kafka: KafkaSettings) -> None:
    config = tiny_config(**{"tier": "opportunistic", "membership_lease_s": 3.0,
                            "kafka": {"bootstrap": kafka.bootstrap, "prefix": kafka.prefix}})
    reader = TopicReader(kafka, "replicas")
    client = _client(kafka)
    try:
        async with running_worker(config) as (worker, http):
            membership = await _routed(worker, http, client)
            result = await client.rank(
                segment="s1", value=1.0, base_count=2,
                candidates=[Candidate(id=i, sparse=[i] * 3) for i in range(2)],
                dense=[0.1] * 4)
            assert result.response.scored == 2
            publish(kafka, "preemption", [("eu1", notice(config.pool, ["w1"],
                                                         deadline_in_ms=30_000))])
            left_after = await _until(
                lambda: membership.routable("baseline", client._clock()) == (), 10.0,
                "a draining worker leaves the routing set")
            assert membership.members()["w1"].state == "draining"
            assert membership.members()["w1"].deadline_ms is not None
        # running_worker stopped the worker and its Kafka I/O: a tombstone, read by the client.
        await _until(lambda: "w1" not in membership.members(), 10.0,
                     "the stopped worker's tombstone reaches the client")
        reader.wait_for(lambda m: m.key() == b"w1" and m.value() is None, 10.0)
        states = _states(reader, "w1")
    finally:
        await client.close()
        reader.close()
    print(f"left the routing set {left_after:.3f}s after the notice; announcements {states}")
    assert left_after < 5.0          # far inside the notice's 30 s
    assert states[0] == "serving" and "draining" in states and states[-1] is None
    assert states.index("draining") > states.index("serving")


async def test_a_worker_killed_with_sigkill_leaves_the_set_when_its_lease_runs_out(
        kafka: KafkaSettings, tmp_path: Path) -> None:
    lease_s = 2.0
    proc = WorkerProc(tmp_path, "k1", tier="opportunistic", kafka=kafka,
                      extra_toml=f"membership_lease_s = {lease_s}")
    client = _client(kafka)
    reader = TopicReader(kafka, "replicas")
    try:
        proc.wait_ready()
        await client.start()
        membership = client.membership
        assert membership is not None
        await _until(lambda: membership.routable("baseline", client._clock()) == (proc.url,),
                     15.0, "the client routes to the worker process")
        result = await client.rank(
            segment="s1", value=1.0, base_count=2, dense=[0.1] * NUM_DENSE,
            candidates=[Candidate(id=i, sparse=[i] * NUM_SPARSE) for i in range(2)])
        assert result.response.scored == 2
        proc.kill()
        gone_after = await _until(
            lambda: membership.routable("baseline", client._clock()) == (), lease_s + 5.0,
            "a killed worker leaves the routing set")
        reader.poll(0.5)
        states = _states(reader, "k1")
    finally:
        if proc.alive():
            proc.kill()
        await client.close()
        reader.close()
    print(f"killed worker left the routing set {gone_after:.2f}s after SIGKILL; {states}")
    # Gone by its lease (renewed every third of it), not by a tombstone: none was left.
    assert gone_after <= lease_s + 1.0
    assert None not in states and set(states) == {"serving"}


async def test_sigterm_announces_draining_before_the_worker_stops(kafka: KafkaSettings) -> None:
    config = tiny_config(**{"worker_id": "s1", "membership_lease_s": 30.0,
                            "kafka": {"bootstrap": kafka.bootstrap, "prefix": kafka.prefix}})
    client = _client(kafka)
    try:
        async with running_worker(config) as (worker, http):
            membership = await _routed(worker, http, client)
            worker.begin_shutdown()       # SIGTERM's first step (server.shut_down)
            left_after = await _until(
                lambda: membership.routable("baseline", client._clock()) == (), 10.0,
                "a worker told to stop leaves the routing set")
            assert membership.members()["s1"].state == "draining"
    finally:
        await client.close()
    print(f"left the routing set {left_after:.3f}s after SIGTERM's first step")
    # Long before the 30 s lease, and the worker had not stopped yet.
    assert left_after < 5.0


async def test_an_announcement_that_does_not_decode_or_names_another_replica_is_dead_lettered(
        kafka: KafkaSettings) -> None:
    good = ReplicaAnnouncement(
        replica_id="x1", endpoint="http://127.0.0.1:9", region="eu1", pool_id=POOL,
        tier="opportunistic", model="baseline", state="serving", ts_ms=1, lease_expires_at_ms=2)
    publish(kafka, "replicas", [("x1", b'{"v": 2, "replica_id": "x1"}'), ("x2", good)])
    letters = TopicReader(kafka, "deadletter")
    client = _client(kafka)
    try:
        await client.start()
        source = kafka.topic("replicas").encode()

        def letter(reason: bytes) -> Any:
            return letters.wait_for(lambda m: m.key() == source and reason in m.value(), 15.0)

        found = [letter(b"missing required field"), letter(b"but the key is")]
    finally:
        await client.close()
        letters.close()
    assert all(m is not None for m in found), letters.messages
    assert client.membership is not None and client.membership.members() == {}
