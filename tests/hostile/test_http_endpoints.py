"""Every HTTP endpoint of a real worker (aiohttp server and torch model in this process, on a
loopback port), fuzzed with raw HTTP: any body, method, path, header or framing.

The worker answers each request quickly with a status below 500; every refusal is JSON with an
`error` that says what was wrong; oversized bodies are refused without being read whole; and the
worker still serves baseline work afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hostile.strategies import HOSTILE_BYTES, mutated, nested
from tests.integration.worker_support import body, rank_request, tiny_config
from workers.api import decode_response
from workers.runtime.server import create_app
from workers.runtime.worker import Worker
from workers.wire import encode_columnar_request

FUZZ = settings(max_examples=120, deadline=3000, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])
LIMIT = 64 * 1024
PATHS = ["/v1/rank", "/healthz", "/readyz", "/metrics", "/", "/v1/rank/", "/v2/rank",
         "/%00", "/..%2f..%2fetc/passwd", "/" + "a" * 3000]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD", "TRACE"]


class ServedWorker:
    """A started worker behind a real aiohttp server, on its own event loop thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.worker = Worker(tiny_config(max_body_bytes=LIMIT))
        self._runner: web.AppRunner | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        await self.worker.start()
        self._runner = web.AppRunner(create_app(self.worker), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def start(self) -> ServedWorker:
        self._thread.start()
        assert self._ready.wait(60)
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            assert self._runner is not None
            await self._runner.cleanup()
            await self.worker.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def request(self, method: str, path: str, payload: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes, float]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        started = time.perf_counter()
        try:
            conn.request(method, path, body=payload, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read(), time.perf_counter() - started
        finally:
            conn.close()


@pytest.fixture(scope="module")
def served() -> Iterator[ServedWorker]:
    server = ServedWorker().start()
    yield server
    server.stop()


def _check(status: int, raw: bytes, seconds: float, method: str = "POST") -> dict[str, Any]:
    assert status < 500, (status, raw[:300])
    assert seconds < 2.0, seconds
    if status >= 400 and method != "HEAD":
        error = json.loads(raw)
        assert isinstance(error["error"], str) and error["error"], error
        assert "server" in error  # load signals even on a refusal
        return dict(error)
    return {}


@FUZZ
@given(payload=HOSTILE_BYTES)
def test_rank_takes_any_body(served: ServedWorker, payload: bytes) -> None:
    status, raw, seconds = served.request("POST", "/v1/rank", payload,
                                          {"content-type": "application/json"})
    _check(status, raw, seconds)
    assert status in (200, 400, 422), (status, raw[:200])


@FUZZ
@given(payload=HOSTILE_BYTES | st.builds(
    lambda valid, cut, noise: valid[:cut] + noise,
    st.just(encode_columnar_request(rank_request(3, 2))), st.integers(0, 400),
    st.binary(max_size=40)))
def test_rank_takes_any_msgpack_body(served: ServedWorker, payload: bytes) -> None:
    status, raw, seconds = served.request("POST", "/v1/rank", payload,
                                          {"content-type": "application/msgpack",
                                           "accept": "application/msgpack"})
    error = _check(status, raw, seconds)
    assert status in (200, 400, 422), (status, raw[:200])
    if status != 200:
        assert error["error"].startswith("RankRequest: "), raw[:200]


@FUZZ
@given(data=st.data())
def test_rank_names_the_field_of_a_mutated_request(served: ServedWorker,
                                                   data: st.DataObject) -> None:
    payload, path, action = data.draw(mutated(rank_request(3, 2)))
    status, raw, seconds = served.request("POST", "/v1/rank", payload)
    error = _check(status, raw, seconds)
    note = (path, action, raw[:200])
    if status == 200:
        response = decode_response(raw)
        assert response.scored >= msgspec.json.decode(payload)["base_count"]
    else:
        assert status in (400, 422) and error["error"].startswith("RankRequest: "), note


@FUZZ
@given(method=st.sampled_from(METHODS), path=st.sampled_from(PATHS) | st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=60).map(
    lambda p: "/" + p.lstrip("/")), payload=st.none() | st.binary(max_size=64))
def test_every_method_and_path_gets_a_clear_answer(served: ServedWorker, method: str, path: str,
                                                   payload: bytes | None) -> None:
    try:
        status, raw, seconds = served.request(method, path, payload)
    except http.client.InvalidURL:
        return  # http.client refuses to send it: nothing reached the worker
    _check(status, raw, seconds, method)


@FUZZ
@given(headers=st.dictionaries(
    st.sampled_from(["content-type", "content-encoding", "accept", "x-request-id",
                     "transfer-encoding", "expect", "connection"]),
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
    max_size=4))
def test_odd_headers_do_not_break_a_valid_request(served: ServedWorker,
                                                  headers: dict[str, str]) -> None:
    headers.pop("transfer-encoding", None)  # framing is exercised on the raw socket below
    headers.pop("expect", None)
    status, raw, seconds = served.request("POST", "/v1/rank", body(2, 1), headers)
    _check(status, raw, seconds)


def _raw_exchange(port: int, data: bytes, timeout_s: float = 5.0) -> bytes:
    """Send raw bytes; return the first response once complete (or whatever came before the
    server closed or `timeout_s` passed). The server may keep reading a refused body for a
    while (aiohttp lingers so the client sees the response): that is not waited for."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        reply = b""
        try:
            while chunk := sock.recv(65536):
                reply += chunk
                head, sep, rest = reply.partition(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), None)
                if sep and length is not None and len(rest) >= length:
                    break
        except (TimeoutError, ConnectionResetError):
            pass
    return reply


def test_oversized_bodies_are_refused_without_reading_them(served: ServedWorker) -> None:
    declared = (b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 1000000000\r\nConnection: close\r\n\r\n{")
    started = time.perf_counter()
    reply = _raw_exchange(served.port, declared)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"exceeds the 65536-byte limit" in reply
    assert time.perf_counter() - started < 2.0

    chunk = b"x" * 8192
    chunked = (b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
               b"Connection: close\r\n\r\n"
               + (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n") * 16 + b"0\r\n\r\n")
    reply = _raw_exchange(served.port, chunked)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"body too large" in reply


def test_deep_nesting_and_many_candidates_are_refused_by_name(served: ServedWorker) -> None:
    for payload in (nested(30_000), nested(10_000, b"{")):  # both under the body limit
        status, raw, seconds = served.request("POST", "/v1/rank", payload)
        assert status == 400 and seconds < 2.0
        assert json.loads(raw)["error"].startswith("RankRequest: ")
    request = msgspec.to_builtins(rank_request(1, 0))
    request["candidates"] = request["candidates"] * 4097
    status, raw, _ = served.request("POST", "/v1/rank", msgspec.json.encode(request)[:LIMIT])
    assert status in (400, 413), raw[:200]
    wrong_shape = msgspec.to_builtins(rank_request(2, 0))
    wrong_shape["dense"] = [0.0] * 7
    status, raw, _ = served.request("POST", "/v1/rank", msgspec.json.encode(wrong_shape))
    assert status == 422 and "`$.dense` has 7 values" in json.loads(raw)["error"]


def test_malformed_http_framing_is_answered_or_closed_not_crashing(served: ServedWorker) -> None:
    for data in (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 64,  # TLS hello
                 b"GET /healthz HTTP/9.9\r\n\r\n", b"POST /v1/rank HTTP/1.1\r\n"
                 b"Content-Length: -5\r\n\r\n", b"\r\n\r\n\r\n", b"GET " + b"/" * 20_000
                 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                 b"POST /v1/rank HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"):
        reply = _raw_exchange(served.port, data, timeout_s=3.0)
        if reply:
            status = int(reply.split(b" ", 2)[1])
            assert 400 <= status < 500, reply[:200]


def test_worker_still_serves_after_the_fuzzing(served: ServedWorker) -> None:
    status, raw, _ = served.request("POST", "/v1/rank", body(4, 2))
    assert status == 200 and decode_response(raw).scored >= 4
    status, _, _ = served.request("GET", "/healthz")
    assert status == 200
    assert served.worker.batcher.running
