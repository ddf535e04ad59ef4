"""The direct notice poster keeps one connection a replica open between posts (real HTTP to a
small stand-in replica): a notice does not wait for a handshake, and a connection the replica
closed meanwhile is replaced without losing the post."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from schemas.contract import PreemptionNotice
from workers.capacity.direct import DirectNotices

POOL = "eu1/rank/baseline/cpu/opportunistic"


class _Replica(ThreadingHTTPServer):
    """Answers every notice ``applied``; counts the connections it accepted."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.posts = 0
        self.close_next = False
        self.accepted: list[socket.socket] = []

    def kill(self) -> None:
        """Go as a process does: stop listening and drop every open connection."""
        self.shutdown()
        self.server_close()
        for sock in self.accepted:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Replica

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1
        self.server.accepted.append(self.connection)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts += 1
        body = json.dumps({"outcome": "applied"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.server.close_next:      # as a replica's idle timeout or restart does
            self.server.close_next = False
            self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _replica() -> Iterator[tuple[_Replica, str]]:
    server = _Replica()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.kill()


def _notice(n: int) -> PreemptionNotice:
    now = int(time.time() * 1000)
    return PreemptionNotice(notice_id=f"n{n}", ts_ms=now, region="eu1", pool_id=POOL,
                            deadline_ms=now + 1000)


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_warm_connects_ahead_and_posts_share_the_connection() -> None:
    direct = DirectNotices(timeout_s=5.0)
    try:
        with _replica() as (replica, url):
            direct.warm([url])
            _wait_for(lambda: replica.connections == 1)
            outcomes = [direct.send(_notice(i), [url])[0].result(5) for i in range(3)]
            assert outcomes == ["applied"] * 3
            assert (replica.connections, replica.posts) == (1, 3)
    finally:
        direct.close()


def test_a_connection_the_replica_closed_is_replaced_and_the_post_lands() -> None:
    direct = DirectNotices(timeout_s=5.0)
    try:
        with _replica() as (replica, url):
            replica.close_next = True
            assert direct.send(_notice(1), [url])[0].result(5) == "applied"
            assert direct.send(_notice(2), [url])[0].result(5) == "applied"
            assert (replica.connections, replica.posts) == (2, 2)
    finally:
        direct.close()
    assert direct.counters == {"applied": 2}


def test_a_replica_gone_is_unreachable_with_one_warning() -> None:
    warnings: list[str] = []
    direct = DirectNotices(timeout_s=2.0, warn=warnings.append)
    try:
        with _replica() as (replica, url):
            assert direct.send(_notice(1), [url])[0].result(5) == "applied"
            replica.kill()          # the replica is gone, and its kept connection with it
        assert direct.send(_notice(2), [url])[0].result(5) == "unreachable"
        assert len(warnings) == 1 and url in warnings[0]
        assert direct._conns == {}            # the gone replica keeps no slot
    finally:
        direct.close()
