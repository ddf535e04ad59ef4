"""The worker over real HTTP with a real (tiny) torch model: baseline always served, optional
work only as targets and admission allow, bad requests answered 4xx by name, metrics exposed;
requests in JSON or msgpack by their content type, answers in what Accept asks for."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import numpy as np
import pytest
from aiohttp.test_utils import TestClient

from schemas.clock import wall_ms
from tests.integration.worker_support import (
    body,
    notice,
    rank_request,
    running_worker,
    targets,
    tiny_config,
)
from workers.api import RANK_PATH, decode_response, encode
from workers.client.client import RankingClient
from workers.client.config import ClientConfig
from workers.runtime.worker import Worker
from workers.wire import (
    ACCEPT_MSGPACK,
    JSON_TYPE,
    MSGPACK_TYPE,
    decode_rank_response,
    encode_columnar_request,
)

Running = tuple[Worker, TestClient]


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    async with running_worker(tiny_config()) as pair:
        yield pair


async def post(client: TestClient, payload: bytes) -> tuple[int, dict]:
    resp = await client.post(RANK_PATH, data=payload,
                             headers={"content-type": "application/json"})
    return resp.status, json.loads(await resp.read())


async def test_without_targets_baseline_is_scored_and_extras_shed_as_stale(
        running: Running) -> None:
    _, client = running
    status, raw = await post(client, body(5, 3))
    assert status == 200
    resp = decode_response(json.dumps(raw).encode())
    assert resp.scored == 5 and len(resp.scores) == 5
    assert (resp.optional_scored, resp.optional_shed, resp.shed_reason) == (0, 3, "stale_targets")
    assert resp.model == "baseline" and resp.server.shedding_level in range(4)


async def test_with_targets_extras_are_scored_up_to_the_target(running: Running) -> None:
    worker, client = running
    assert worker.offer_targets(targets(epoch=1, extra=4)).accepted
    status, raw = await post(client, body(3, 2))
    assert status == 200 and raw["scored"] == 5 and raw["optional_scored"] == 2
    status, raw = await post(client, body(3, 6))
    assert raw["scored"] == 7 and raw["optional_shed"] == 2
    assert raw["shed_reason"] == "over_target"


async def test_the_room_for_extras_is_said_to_a_request_that_asks_and_to_no_other(
        running: Running) -> None:
    worker, client = running
    assert worker.offer_targets(targets(epoch=1, extra=4)).accepted
    _, plain = await post(client, body(3, 2))
    assert "optional_room" not in plain["server"]
    asked_for = msgspec.structs.replace(rank_request(3, 2), report_room=True)
    _, asked = await post(client, encode(asked_for))
    assert asked["server"]["optional_room"] > 0     # an idle replica has room


async def test_scores_match_the_model_in_request_order(running: Running) -> None:
    worker, client = running
    worker.offer_targets(targets(epoch=1, extra=8))
    req = rank_request(4, 3, seed=11)
    _, raw = await post(client, encode(req))
    assert worker.model is not None
    direct = worker.model.score(np.tile(np.asarray(req.dense, np.float32), (7, 1)),
                                np.asarray([c.sparse for c in req.candidates], np.int64))
    np.testing.assert_allclose(raw["scores"], direct, rtol=1e-5, atol=1e-6)


async def test_baseline_is_always_served_while_preempted(running: Running) -> None:
    worker, client = running
    worker.offer_targets(targets(epoch=1, extra=8))
    assert worker.on_preemption(notice(worker.config.pool)) == "applied"
    results = await asyncio.gather(*(post(client, body(4, 4, request_id=f"r{i}", seed=i))
                                     for i in range(40)))
    for status, raw in results:
        assert status == 200
        assert raw["scored"] == 4 and raw["optional_scored"] == 0
        assert raw["shed_reason"] == "preemption"
        assert raw["server"]["preempted"] is True and raw["server"]["shedding_level"] == 3
    ready = await client.get("/readyz")
    assert ready.status == 503 and "draining_until_ms" in await ready.json()


async def test_newer_targets_after_preemption_resume_optional_work(running: Running) -> None:
    worker, client = running
    worker.offer_targets(targets(epoch=1, issued_at_ms=wall_ms() - 1000))
    first = notice(worker.config.pool, replicas=["w1"])
    assert worker.on_preemption(first) == "applied"
    stale = worker.offer_targets(targets(epoch=2, issued_at_ms=wall_ms() - 500))
    assert not stale.accepted  # issued before the preemption: must not switch work back on
    assert worker.offer_targets(targets(epoch=3, issued_at_ms=wall_ms() + 5)).accepted
    _, raw = await post(client, body(2, 2))
    assert raw["optional_scored"] == 2 and "preempted" not in raw["server"]   # false: left out
    # The same notice read again (a consumer restart) must not stop work a second time.
    assert worker.on_preemption(first) == "duplicate"
    assert (await post(client, body(2, 2)))[1]["optional_scored"] == 2


async def test_past_its_reclaim_deadline_newer_targets_do_not_resume_optional_work(
        running: Running) -> None:
    worker, client = running
    worker.offer_targets(targets(epoch=1, issued_at_ms=wall_ms() - 1000))
    zero_notice = notice(worker.config.pool, replicas=["w1"], deadline_in_ms=0)
    assert worker.on_preemption(zero_notice) == "applied"
    assert worker.offer_targets(targets(epoch=2, issued_at_ms=wall_ms() + 5)).accepted
    _, raw = await post(client, body(2, 2))
    assert raw["optional_scored"] == 0 and raw["shed_reason"] == "preemption"
    assert raw["server"]["preempted"] is True and worker.draining


async def test_notices_for_other_pools_or_replicas_change_nothing(running: Running) -> None:
    worker, client = running
    worker.offer_targets(targets(epoch=1))
    assert worker.on_preemption(notice("eu1/rank/powerful/a100/opportunistic")) == "not_mine"
    assert worker.on_preemption(notice(worker.config.pool, replicas=["w9"])) == "not_mine"
    before_start = notice(worker.config.pool, ts_ms=wall_ms() - 60_000, deadline_in_ms=30_000)
    assert worker.on_preemption(before_start) == "stale"
    _, raw = await post(client, body(2, 2))
    assert raw["optional_scored"] == 2


async def test_a_zero_notice_reclaim_stops_optional_work_at_once(running: Running) -> None:
    # What a hardware failure, or Kafka lag longer than the notice, looks like: the notice
    # arrives at (or after) its own deadline. The replica still runs until it is killed.
    worker, client = running
    worker.offer_targets(targets(epoch=1, extra=4))
    assert (await post(client, body(2, 4)))[1]["optional_scored"] == 4
    late = notice(worker.config.pool, deadline_in_ms=0)
    assert worker.on_preemption(late) == "applied"
    status, raw = await post(client, body(2, 4))
    assert status == 200 and raw["scored"] == 2 and raw["shed_reason"] == "preemption"
    assert worker.metrics.preemptions._value.get() == 1.0


async def test_expired_targets_fall_back_to_baseline_only(running: Running) -> None:
    worker, client = running
    worker.offer_targets(targets(epoch=1, ttl_ms=300))
    _, raw = await post(client, body(2, 2))
    assert raw["optional_scored"] == 2
    await asyncio.sleep(0.35)
    _, raw = await post(client, body(2, 2))
    assert raw["optional_scored"] == 0 and raw["shed_reason"] == "stale_targets"


@pytest.mark.parametrize(("payload", "status", "named"), [
    (b"{not json", 400, "malformed JSON"),
    (b'{"segment": "s", "value": 1, "deadline_ms": 5, "candidates": [], "base_count": 0}',
     400, "request_id"),
    (b'{"request_id": "r", "segment": "s", "value": "high", "deadline_ms": 5, '
     b'"candidates": [], "base_count": 0}', 400, "$.value"),
    (b'{"request_id": "r", "segment": "s", "value": 1, "deadline_ms": 5, '
     b'"candidates": [], "base_count": 2}', 400, "base_count"),
    (b'{"request_id": "r", "segment": "s", "value": 1, "deadline_ms": 5, "dense": [1.0], '
     b'"candidates": [], "base_count": 0}', 422, "$.dense"),
    (b'{"request_id": "r", "segment": "s", "value": 1, "deadline_ms": 5, '
     b'"dense": [0, 0, 0, 0], "candidates": [{"id": 1, "sparse": [1, 2, 3]}, '
     b'{"id": 2, "sparse": [1]}], "base_count": 1}', 422, "$.candidates[1].sparse"),
    (b'{"request_id": "r", "segment": "s", "value": 1, "deadline_ms": 5, "candidates": [], '
     b'"base_count": 0, "extra": true}', 400, "extra"),
], ids=["bad-json", "missing-field", "wrong-type", "base-count", "dense-shape",
        "sparse-shape", "unknown-field"])
async def test_malformed_requests_get_4xx_naming_the_problem_and_serving_goes_on(
        running: Running, payload: bytes, status: int, named: str) -> None:
    _, client = running
    got, raw = await post(client, payload)
    assert got == status
    assert named in raw["error"]
    assert set(raw["server"]) == {"queue_delay_ms", "in_flight", "shedding_level"}
    ok, _ = await post(client, body(2, 0))
    assert ok == 200


async def test_oversized_body_is_refused_with_413() -> None:
    async with running_worker(tiny_config(max_body_bytes=2048)) as (_, client):
        status, raw = await post(client, body(60, 0))
        assert status == 413 and "2048-byte limit" in raw["error"]
        assert (await post(client, body(2, 0)))[0] == 200


async def test_unknown_routes_and_methods_answer_json(running: Running) -> None:
    _, client = running
    resp = await client.get(RANK_PATH)
    assert resp.status == 405 and "GET /v1/rank" in (await resp.json())["error"]
    resp = await client.get("/nope")
    assert resp.status == 404 and "/nope" in (await resp.json())["error"]


async def test_health_says_the_model_shape_and_ready_without_kafka(running: Running) -> None:
    _, client = running
    health = await (await client.get("/healthz")).json()
    assert health["num_dense"] == 4 and health["num_sparse"] == 3
    ready = await client.get("/readyz")
    assert ready.status == 200 and (await ready.json())["status"] == "ready"


async def test_metrics_expose_latency_batches_sheds_targets_and_kafka(running: Running) -> None:
    worker, client = running
    await post(client, body(3, 2))  # extras shed: no targets yet
    worker.offer_targets(targets(epoch=4, extra=2))
    await post(client, body(3, 2))
    text = await (await client.get("/metrics")).text()
    for needle in (
            'surplus_worker_latency_seconds_count{work_class="baseline"} 2.0',
            'surplus_worker_latency_seconds_count{work_class="optional"} 1.0',
            "surplus_worker_batch_rows_count",
            'surplus_worker_optional_shed_units_total{reason="stale_targets"} 2.0',
            "surplus_worker_targets_epoch 4.0",
            "surplus_worker_targets_extra_candidates 2.0",
            'surplus_worker_target_verdicts_total{verdict="applied"} 1.0',
            "surplus_worker_kafka_outages_total 0.0",
            "surplus_worker_preemption_reaction_seconds_count 0.0",
            'surplus_worker_requests_total{outcome="ok"} 2.0'):
        assert needle in text, needle


async def test_opportunistic_powerful_replica_does_whole_requests_or_none() -> None:
    config = tiny_config(tier="opportunistic", **{"model.name": "powerful"})
    assert config.pool == "eu1/rank/powerful/cpu/opportunistic"
    async with running_worker(config) as (worker, client):
        status, raw = await post(client, body(3, 2))
        # No targets: not even the "baseline" candidates are scored here, and the answer is
        # not a 200, so a client cannot mistake it for a ranking and falls back.
        assert status == 503 and raw["shed_reason"] == "stale_targets"
        worker.offer_targets(targets(epoch=1, extra=0))
        status, raw = await post(client, body(3, 2))
        # The request is served whole, its extras held to the target as on a ranking replica.
        assert status == 200 and raw["model"] == "powerful" and raw["scored"] == 3
        worker.offer_targets(targets(epoch=2, extra=2))
        status, raw = await post(client, body(3, 2))
        assert status == 200 and raw["scored"] == 5
        worker.on_preemption(notice(config.pool))
        status, raw = await post(client, body(3, 2))
        assert status == 503 and raw["shed_reason"] == "preemption"
        assert worker.batcher.state().shed_units == {"stale_targets": 5, "over_target": 2,
                                                     "preemption": 5}


async def test_under_overload_optional_work_is_shed_and_baseline_still_served() -> None:
    # A queue-delay bound below one row's service time: every optional unit is "overload".
    async with running_worker(tiny_config(**{"admission.max_queue_delay_ms": 0.01})) as (
            worker, client):
        worker.offer_targets(targets(epoch=1, extra=8))
        results = await asyncio.gather(*(post(client, body(4, 4, request_id=f"r{i}", seed=i))
                                         for i in range(30)))
        for status, raw in results:
            assert status == 200 and raw["scored"] == 4
            assert raw["shed_reason"] == "overload"
        assert worker.batcher.state().shed_units == {"overload": 120}


async def test_a_connection_is_closed_after_its_quota_of_responses_and_the_client_goes_on(
        ) -> None:
    async with running_worker(tiny_config(max_requests_per_connection=3)) as (_, client):
        answers = [await client.get("/healthz") for _ in range(7)]
        closing = [r.headers.get("Connection", "").lower() == "close" for r in answers]
        assert [r.status for r in answers] == [200] * 7
        assert closing == [False, False, True, False, False, True, False]


async def post_as(client: TestClient, payload: bytes, content_type: str,
                  accept: str | None = None) -> tuple[int, str, bytes]:
    headers = {"content-type": content_type, **({"accept": accept} if accept else {})}
    resp = await client.post(RANK_PATH, data=payload, headers=headers)
    return resp.status, resp.content_type, await resp.read()


async def test_msgpack_request_is_scored_like_json_and_answered_in_what_accept_asks(
        running: Running) -> None:
    worker, client = running
    worker.offer_targets(targets(epoch=1, extra=8))
    req = rank_request(4, 3, seed=11)
    status, ctype, raw = await post_as(client, encode_columnar_request(req), MSGPACK_TYPE,
                                       ACCEPT_MSGPACK)
    assert (status, ctype) == (200, MSGPACK_TYPE)
    packed = decode_rank_response(raw, ctype)
    assert packed.scored == 7 and packed.optional_scored == 3
    _, json_raw = await post(client, encode(req))
    np.testing.assert_allclose(packed.scores, json_raw["scores"], rtol=1e-6)
    status, ctype, raw = await post_as(client, encode_columnar_request(req), MSGPACK_TYPE)
    assert (status, ctype) == (200, JSON_TYPE)          # no Accept: JSON, for people
    assert json.loads(raw)["scores"] == pytest.approx(packed.scores, rel=1e-6)


async def test_curl_default_form_type_is_read_as_json(running: Running) -> None:
    _, client = running
    status, _, raw = await post_as(client, body(2, 0), "application/x-www-form-urlencoded")
    assert status == 200 and json.loads(raw)["scored"] == 2


async def test_unknown_content_type_gets_415_naming_it_and_what_to_send(
        running: Running) -> None:
    worker, client = running
    status, ctype, raw = await post_as(client, body(2, 0), "text/csv")
    error = json.loads(raw)
    assert (status, ctype) == (415, JSON_TYPE)
    assert "'text/csv'" in error["error"] and MSGPACK_TYPE in error["error"]
    assert set(error["server"]) == {"queue_delay_ms", "in_flight", "shedding_level"}
    assert (await post(client, body(2, 0)))[0] == 200
    assert worker.metrics.requests.labels("bad_request")._value.get() == 1.0


def _packed(mutate: Callable[[dict[str, Any]], None]) -> bytes:
    wire = msgspec.msgpack.decode(encode_columnar_request(rank_request(2, 1)))
    mutate(wire)
    return msgspec.msgpack.encode(wire)


def _narrow(wire: dict[str, Any]) -> None:
    sparse = np.zeros((3, 2), dtype="<i4")
    wire["sparse"] = {"dtype": "<i4", "shape": [3, 2], "data": sparse.tobytes()}


@pytest.mark.parametrize(("payload", "status", "named"), [
    (b"\xc1\x00", 400, "malformed msgpack"),
    (body(2, 1), 400, "the body looks like JSON; declare it as application/json"),
    (_packed(lambda w: w.pop("request_id")), 400, "`request_id`"),
    (_packed(lambda w: w["sparse"].update(dtype=">i8")), 400, "`$.sparse.dtype` is '>i8'"),
    (_packed(lambda w: w["sparse"].update(shape=[3, 4])), 400, "`$.sparse.data` has 36 bytes"),
    (_packed(lambda w: w["priors"].update(shape=[2], data=b"\0" * 16)), 400,
     "`$.priors.shape` is [2] but `$.ids` has 3"),
    (_packed(lambda w: w.update(base_count=4)), 400, "`$.base_count` is 4"),
    (_packed(_narrow), 422, "`$.sparse` has 2 ids per candidate; the baseline model takes 3"),
    (_packed(lambda w: w["dense"].update(shape=[1], data=b"\0" * 8)), 422,
     "`$.dense` has 1 values"),
], ids=["not-msgpack", "json-body", "missing-field", "big-endian", "data-length",
        "rows-disagree", "base-count", "sparse-width", "dense-width"])
async def test_malformed_msgpack_requests_get_4xx_naming_the_field_and_serving_goes_on(
        running: Running, payload: bytes, status: int, named: str) -> None:
    _, client = running
    got, ctype, raw = await post_as(client, payload, MSGPACK_TYPE, ACCEPT_MSGPACK)
    error = json.loads(raw)                          # errors are JSON whatever was accepted
    assert (got, ctype) == (status, JSON_TYPE)
    assert error["error"].startswith("RankRequest: ") and named in error["error"]
    ok, _, _ = await post_as(client, encode_columnar_request(rank_request(2, 0)), MSGPACK_TYPE)
    assert ok == 200


async def test_oversized_msgpack_body_is_refused_with_413() -> None:
    async with running_worker(tiny_config(max_body_bytes=2048)) as (_, client):
        status, _, raw = await post_as(client, encode_columnar_request(rank_request(200, 0)),
                                       MSGPACK_TYPE)
        assert status == 413 and "2048-byte limit" in json.loads(raw)["error"]


async def test_the_ranking_client_gets_the_same_scores_from_the_worker_in_either_encoding(
        running: Running) -> None:
    worker, client = running
    url = str(client.make_url("")).rstrip("/")
    req = rank_request(5, 0, seed=3)
    scores = {}
    for encoding in ("msgpack", "json"):
        config = ClientConfig(scope="eu1", baseline_urls=[url], encoding=encoding,
                              holdout_fraction=0.0)
        async with RankingClient(config) as ranking:
            result = await ranking.rank(segment="s1", value=1.0, candidates=req.candidates,
                                        base_count=5, dense=req.dense)
        scores[encoding] = result.response.scores
    np.testing.assert_allclose(scores["msgpack"], scores["json"], rtol=1e-6)
    assert len(scores["msgpack"]) == 5
    assert worker.metrics.requests.labels("ok")._value.get() == 2.0
