"""A preemption notice straight to the replica (``POST /v1/preempt``) over real HTTP to a worker
with a real torch model: it stops optional work as a Kafka notice does, the copy that comes by
the other path counts as a duplicate, and bad or foreign posts are refused by name."""

from __future__ import annotations

import asyncio
import json
import socket

from aiohttp.test_utils import TestClient

from schemas.codec import encode as encode_event
from tests.integration.worker_support import body, notice, running_worker, targets, tiny_config
from workers.api import NOTICE_PATH, RANK_PATH
from workers.capacity.direct import DirectNotices


async def post_notice(client: TestClient, payload: bytes) -> tuple[int, dict]:
    resp = await client.post(NOTICE_PATH, data=payload,
                             headers={"content-type": "application/json"})
    return resp.status, json.loads(await resp.read())


def sample(worker_metrics: str, name: str) -> float:
    for line in worker_metrics.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_posted_notice_stops_optional_work_and_the_kafka_copy_is_a_duplicate() -> None:
    async with running_worker(tiny_config()) as (worker, client):
        worker.offer_targets(targets(epoch=1, extra=8))
        reclaim = notice(worker.config.pool, notice_id="storm-1")
        status, answer = await post_notice(client, encode_event(reclaim))
        assert (status, answer["outcome"], answer["notice_id"]) == (200, "applied", "storm-1")
        assert answer["server"]["preempted"] is True

        resp = await client.post(RANK_PATH, data=body(3, 4),
                                 headers={"content-type": "application/json"})
        ranked = json.loads(await resp.read())
        assert resp.status == 200 and ranked["scored"] == 3          # baseline still served
        assert (ranked["optional_shed"], ranked["shed_reason"]) == (4, "preemption")

        assert worker.on_preemption(reclaim, path="kafka") == "duplicate"
        metrics = (await (await client.get("/metrics")).read()).decode()
        assert sample(metrics, 'surplus_worker_preemption_notices_total{outcome="applied",'
                               'path="http"}') == 1.0
        assert sample(metrics, 'surplus_worker_preemption_notices_total{outcome="duplicate",'
                               'path="kafka"}') == 1.0
        assert sample(metrics, "surplus_worker_preemption_reaction_seconds_count") == 1.0
        assert sample(metrics, "surplus_worker_preemption_delivery_seconds_count") == 1.0


async def test_a_notice_for_another_pool_is_answered_not_mine() -> None:
    async with running_worker(tiny_config()) as (worker, client):
        status, answer = await post_notice(
            client, encode_event(notice("eu1/rank/powerful/a100/opportunistic")))
        assert (status, answer["outcome"]) == (200, "not_mine")
        assert not worker.server_state().preempted


async def test_a_bad_notice_body_is_a_400_naming_what_is_wrong() -> None:
    async with running_worker(tiny_config()) as (worker, client):
        status, answer = await post_notice(client, b'{"v": 1, "notice_id": "x"}')
        assert status == 400 and "PreemptionNotice" in answer["error"]
        assert "missing required field" in answer["error"]
        status, answer = await post_notice(client, b"not json")
        assert status == 400 and "malformed JSON" in answer["error"]
        assert not worker.server_state().preempted


async def test_notices_from_outside_notice_from_are_refused_by_name() -> None:
    async with running_worker(tiny_config(notice_from=["10.0.0.0/8"])) as (worker, client):
        status, answer = await post_notice(client, encode_event(notice(worker.config.pool)))
        assert status == 403
        assert "10.0.0.0/8 only (`notice_from`); 127.0.0.1 is not among them" in answer["error"]
        assert not worker.server_state().preempted


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_direct_notices_reach_a_live_worker_and_an_absent_one_is_one_warning() -> None:
    warnings: list[str] = []
    direct = DirectNotices(timeout_s=2.0, warn=warnings.append)
    absent = f"http://127.0.0.1:{_closed_port()}"
    try:
        async with running_worker(tiny_config()) as (worker, client):
            live = str(client.make_url("")).rstrip("/")
            first = notice(worker.config.pool, notice_id="n1")
            outcomes = [await asyncio.wrap_future(f) for f in direct.send(first, [live, absent])]
            assert outcomes == ["applied", "unreachable"]
            again = direct.send(notice(worker.config.pool, notice_id="n2"), [absent, live])
            assert [await asyncio.wrap_future(f) for f in again] == ["unreachable", "applied"]
            assert worker.server_state().preempted
    finally:
        direct.close()
    assert direct.counters == {"applied": 2, "unreachable": 2}
    assert len(warnings) == 1 and absent in warnings[0] and "Kafka copy" in warnings[0]


def test_notice_from_reads_a_dual_stack_sockets_view_of_an_ipv4_peer() -> None:
    from workers.runtime.server import _notice_allowed

    nets = tiny_config().notice_networks()            # the default: the machine itself
    assert _notice_allowed("127.0.0.1", nets) and _notice_allowed("::1", nets)
    assert _notice_allowed("::ffff:127.0.0.1", nets)  # a worker bound to "::"
    assert not _notice_allowed("10.1.2.3", nets) and not _notice_allowed("::ffff:10.1.2.3", nets)
    assert not _notice_allowed("", nets)
