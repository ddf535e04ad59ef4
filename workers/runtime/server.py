"""The worker's HTTP face: POST /v1/rank, POST /v1/preempt, GET /healthz, /readyz, /metrics.

Bodies are decoded with the shared strict codecs: a rank request is JSON or msgpack by its
Content-Type, and answered in what its Accept asks for (`workers.wire`; JSON by default, 415
for a type it does not read). Anything malformed, oversized or of the wrong shape gets a 4xx
JSON ``{"error": "..."}`` that names the problem, and the worker keeps serving. Every
response, errors included, carries the worker's ``ServerState`` so clients can shed on their
own before the control loop reacts.

``serve(config)`` runs one worker until SIGTERM/SIGINT: HTTP first (so /healthz answers while
the model loads), then the model and the inference thread, then Kafka. On a signal, in this
order and within ``shutdown_grace_s``: it turns not-ready and refuses new requests; stops
optional work at once; publishes a notice for itself with the grace period as its notice (an
opportunistic replica: the control plane's fast path drops its share) and says ``draining``
on the replicas topic (clients stop routing here); finishes the baseline work in flight;
flushes telemetry, leaves its membership tombstone and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import weakref
from collections.abc import Awaitable, Callable
from ipaddress import IPv4Network, IPv6Address, IPv6Network, ip_address
from typing import Any

import msgspec
from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from schemas.clock import wall_ms_fine
from schemas.codec import ContractError, codec_for
from schemas.contract import PreemptionNotice
from schemas.heap import freeze_startup_heap
from workers.api import NOTICE_PATH, RANK_PATH
from workers.runtime.config import WorkerConfig
from workers.runtime.worker import ModelFailure, NotReady, OptionalShed, RequestError, Worker
from workers.wire import (
    CONTENT_TYPES,
    JSON_TYPE,
    MSGPACK_TYPE,
    decode_rank_request,
    encode_rank_response,
    request_encoding,
    response_encoding,
)

log = logging.getLogger("surplus.worker")

#: How long a thread may hold the GIL while another waits for it, in a worker process
#: (`surplus worker` sets it). A notice reaches the worker on a Kafka thread that must take the
#: GIL from a busy event loop and batcher before it can stop optional work; at CPython's
#: default (5 ms) each hand-off may cost that much. In the demo, 0.5 ms took the
#: notice-to-shed p99 from 17.5 ms to 7.5 ms (mean 3.5 to 2.5 ms, 100 reactions each).
GIL_SWITCH_INTERVAL_S = 0.0005

WORKER_KEY = web.AppKey("worker", Worker)
#: Responses served so far on each open connection (entries go with their connections).
SERVED_KEY = web.AppKey("served_per_connection", weakref.WeakKeyDictionary)
NOTICE_NETS_KEY = web.AppKey("notice_networks", tuple)
_json = msgspec.json.Encoder()
_notice_codec = codec_for(PreemptionNotice)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json_response(worker: Worker, status: int, body: dict[str, Any]) -> web.Response:
    body.setdefault("server", msgspec.to_builtins(worker.server_state()))
    return web.Response(status=status, body=_json.encode(body), content_type="application/json")


@web.middleware
async def _errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure is JSON naming the problem; an unexpected one never kills the worker."""
    worker = request.app[WORKER_KEY]
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge as exc:
        return _json_response(worker, 413, {"error": f"body too large: {exc.text}"})
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _json_response(worker, exc.status, {"error": f"{exc.reason}: {request.method} "
                                                            f"{request.path}"})
    except Exception as exc:
        log.exception("unexpected error on %s", request.path)
        return _json_response(worker, 500, {"error": f"internal error: {type(exc).__name__}"})


@web.middleware
async def _recycle_connections(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Close a keep-alive connection after ``max_requests_per_connection`` responses, so that
    connections opened for a burst go away once it is over instead of staying for the life of
    the client and the worker (found by ``surplus soak``: a client's pool takes its idle
    connections in turn, none idles long enough to expire, and the open sockets on both
    sides grew a step with each busier burst). The client opens a new one when it needs it."""
    response = await handler(request)
    limit = request.app[WORKER_KEY].config.max_requests_per_connection
    transport = request.transport
    if limit and transport is not None:
        served = request.app[SERVED_KEY]
        count = served.get(transport, 0) + 1
        if count >= limit:
            response.force_close()
            served.pop(transport, None)
        else:
            served[transport] = count
    return response


async def _rank(request: web.Request) -> web.Response:
    worker = request.app[WORKER_KEY]
    limit = worker.config.max_body_bytes
    declared = request.headers.get(hdrs.CONTENT_TYPE)
    encoding = request_encoding(declared)
    if encoding is None:
        worker.metrics.requests.labels("bad_request").inc()
        return _json_response(worker, 415, {
            "error": f"RankRequest: content type {declared!r} is not one this endpoint reads; "
                     f"send {JSON_TYPE} (the default) or {MSGPACK_TYPE}"})
    if request.content_length is not None and request.content_length > limit:
        worker.metrics.requests.labels("bad_request").inc()
        return _json_response(worker, 413, {"error": f"body of {request.content_length} bytes "
                                                     f"exceeds the {limit}-byte limit"})
    body = await request.read()
    try:
        rank_request = decode_rank_request(body, encoding, max_bytes=limit)
    except ContractError as exc:
        worker.metrics.requests.labels("bad_request").inc()
        status = 413 if "exceeds the" in exc.reason else 400
        return _json_response(worker, status, {"error": str(exc)})
    try:
        response = await worker.rank(rank_request)
    except RequestError as exc:
        worker.metrics.requests.labels("bad_request").inc()
        return _json_response(worker, 422, {"error": f"RankRequest: {exc}"})
    except OptionalShed as exc:
        worker.metrics.requests.labels("optional_shed").inc()
        return _json_response(worker, 503, {"error": str(exc), "shed_reason": exc.reason})
    except NotReady as exc:
        worker.metrics.requests.labels("not_ready").inc()
        return _json_response(worker, 503, {"error": str(exc)})
    except ModelFailure as exc:
        return _json_response(worker, 500, {"error": str(exc)})
    answer = response_encoding(request.headers.get(hdrs.ACCEPT))
    return web.Response(body=encode_rank_response(response, answer),
                        content_type=CONTENT_TYPES[answer])


async def _preempt(request: web.Request) -> web.Response:
    """A `PreemptionNotice` straight from the platform beside this replica (its capacity
    agent, the scheduler that lent it): the same rule as a notice read from Kafka
    (`Worker.on_preemption`), without the broker's delivery in between. 200 with the
    outcome (``applied``, or ``duplicate`` when the Kafka copy was first, ``not_mine``,
    ``stale``); 403 from outside ``notice_from``; 400 naming what is wrong with the body.

    With a signing key the address is not enough: the request's headers must sign its body
    with a key of the ring, at a time within ``notice_request_window_s`` (no replay), and the
    notice must carry its issuer's signature (`Worker.notice_refusal`); otherwise 401 naming
    the reason (``unsigned``, ``unknown_key``, ``bad_signature``, ``stale_request``), counted
    and dead-lettered."""
    read_ms = wall_ms_fine()
    worker = request.app[WORKER_KEY]
    remote = request.remote or ""
    if not _notice_allowed(remote, request.app[NOTICE_NETS_KEY]):
        return _json_response(worker, 403, {
            "error": f"preemption notices are taken from {', '.join(worker.config.notice_from)}"
                     f" only (`notice_from`); {remote or 'an unknown address'} is not among "
                     f"them"})
    body = await request.read()
    try:
        notice = _notice_codec.decode(body)
    except ContractError as exc:
        return _json_response(worker, 400, {"error": str(exc)})
    refusal = worker.notice_refusal(notice, path="http", headers=request.headers, body=body)
    if refusal is not None:
        if worker.kafka is not None:
            worker.kafka.deadletters.send_request(
                f"http:{NOTICE_PATH}", body,
                f"PreemptionNotice from {remote}: {refusal}")
        return _json_response(worker, 401, {
            "error": f"preemption notice refused: {refusal} (sign it with a key this replica "
                     f"holds: see docs/security.md)", "refused": refusal})
    outcome = worker.on_preemption(notice, path="http", read_ms=read_ms)
    return _json_response(worker, 200, {"outcome": outcome, "notice_id": notice.notice_id})


def _notice_allowed(remote: str, nets: tuple[IPv4Network | IPv6Network, ...]) -> bool:
    try:
        address = ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped   # a dual-stack socket's view of an IPv4 peer
    return any(address in net for net in nets)


async def _healthz(request: web.Request) -> web.Response:
    """Alive: the event loop answers. Also says what the model takes: its inputs (the spec a
    request's features are checked against) and, for the fixed signature, its two widths."""
    worker = request.app[WORKER_KEY]
    cfg = worker.config.model
    return _json_response(worker, 200, {
        "status": "ok", "worker_id": worker.config.worker_id, "pool_id": worker.config.pool,
        "model": cfg.name, "num_dense": cfg.config.num_dense,
        "num_sparse": cfg.config.num_sparse,
        "inputs": msgspec.to_builtins(worker.signature.inputs)})


async def _readyz(request: web.Request) -> web.Response:
    worker = request.app[WORKER_KEY]
    ready, detail = worker.readiness()
    return _json_response(worker, 200 if ready else 503,
                          {"status": "ready" if ready else "not_ready", **detail})


async def _metrics(request: web.Request) -> web.Response:
    worker = request.app[WORKER_KEY]
    body = generate_latest(worker.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_app(worker: Worker) -> web.Application:
    """The aiohttp application of one worker (the worker is started separately)."""
    # aiohttp's own limit is a little above ours so that we, not it, word the 413.
    app = web.Application(client_max_size=worker.config.max_body_bytes + 1,
                          middlewares=[_errors_as_json, _recycle_connections])
    app[WORKER_KEY] = worker
    app[SERVED_KEY] = weakref.WeakKeyDictionary()
    app[NOTICE_NETS_KEY] = worker.config.notice_networks()
    app.router.add_post(RANK_PATH, _rank)
    app.router.add_post(NOTICE_PATH, _preempt)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    return app


async def serve(config: WorkerConfig, stop: asyncio.Event | None = None,
                on_ready: Callable[[Worker, int], None] | None = None,
                freeze_heap: bool = False) -> None:
    """Run one worker until ``stop`` is set or SIGTERM/SIGINT arrives, then shut down cleanly.

    ``on_ready(worker, port)`` is called once the port is bound and the model serves. With
    ``freeze_heap`` (a process that serves this worker alone) the start-up heap is frozen once
    the model is loaded and before the replica announces itself, so the one long collection
    that takes falls before any request can reach it (``schemas.heap``).
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)
    worker = Worker(config)
    runner = web.AppRunner(create_app(worker), access_log=None,
                           shutdown_timeout=config.shutdown_grace_s)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = runner.addresses[0][1]
    worker.endpoint = config.endpoint(port)
    kafka = None
    try:
        await worker.start()
        if freeze_heap:
            freeze_startup_heap()
        kafka = start_kafka(worker)
        log.info("worker %s serving %s on %s:%d", config.worker_id, worker.model and
                 worker.model.source, config.host, port)
        if on_ready is not None:
            on_ready(worker, port)
        await stop.wait()
    finally:
        await shut_down(worker, kafka, site, runner)


async def shut_down(worker: Worker, kafka: Any, site: web.TCPSite,
                    runner: web.AppRunner) -> None:
    """The SIGTERM sequence (module docstring), every step bounded by the grace period."""
    config = worker.config
    grace_ends = time.monotonic() + config.shutdown_grace_s

    def left(cap_s: float) -> float:
        return max(0.1, min(cap_s, grace_ends - time.monotonic()))

    log.info("worker %s shutting down (grace %.1f s)", config.worker_id, config.shutdown_grace_s)
    notice = worker.begin_shutdown()
    if kafka is not None and config.tier == "opportunistic":
        sent = await asyncio.to_thread(kafka.publish_notice, notice, left(2.0))
        log.info("worker %s notice %s %s", config.worker_id, notice.notice_id,
                 "published" if sent else "not delivered")
    await site.stop()
    await worker.stop(left(config.shutdown_grace_s))
    if kafka is not None:
        await asyncio.to_thread(kafka.stop, left(10.0))
    await runner.cleanup()


def start_kafka(worker: Worker) -> Any:
    """Start the worker's Kafka threads if its config has Kafka; returns them (or None)."""
    settings = worker.config.kafka_settings()
    if settings is None:
        return None
    from workers.runtime.kafka_io import KafkaIO

    kafka = KafkaIO(worker, settings)
    kafka.start()
    worker.kafka = kafka
    return kafka
