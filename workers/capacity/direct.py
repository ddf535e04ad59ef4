"""Notices straight to the replicas they reclaim: ``POST /v1/preempt`` beside the Kafka copy.

Kafka carries every notice to the whole fleet (the control plane, the clients, the workers),
but its delivery is a produce, a broker append and a fetch: milliseconds on a quiet broker, tens
on a loaded one or during a collector pause, and the replica must stop optional work within
milliseconds. Whoever learns of the reclaim next to the replica (the capacity agent in its pod,
the scheduler that lent it) can also tell the replica itself, over HTTP, as Kubernetes calls a
pod's preStop hook. The replica applies whichever copy comes first and counts the other as a
``duplicate`` (``Worker.on_preemption``), so the two paths never stop it twice.

With a keyring (``keys``) each post carries the headers that authenticate its body at the time
it leaves (`schemas.signing.Keyring.sign_request`): a replica holding the key refuses a
notice without them, so the address it comes from is not all that vouches for it.

``DirectNotices.send`` hands each post to a small thread pool and returns at once: the Kafka
send behind it is not held up, and a replica that does not answer (it is being torn down, it
was never up) costs one log line per replica and change, never an exception; it still has the
Kafka copy.

Each replica's connection is kept open between posts (``warm`` opens it ahead of the first
one): a new one per notice paid a TCP handshake and the replica's accept before the notice
itself, and no demo delivery came under a millisecond. A kept connection the replica has
since closed (an idle timeout, a restart) fails at once; the post then goes again on a new
one, which a replica takes as it takes any second copy, a ``duplicate``.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from urllib.parse import urlsplit

from schemas.clock import wall_ms
from schemas.codec import encode
from schemas.contract import PreemptionNotice
from schemas.signing import KeySource
from workers.api import NOTICE_PATH
from workers.capacity.quiet import OncePerChange

log = logging.getLogger("surplus.direct_notices")


class DirectNotices:
    """Posts notices to replica base URLs (``http://host:port``) on ``threads`` threads."""

    def __init__(self, *, timeout_s: float = 1.0, threads: int = 4,
                 warn: Callable[[str], None] = log.warning,
                 keys: KeySource | None = None) -> None:
        """``keys``: sign each post's body in its headers (None: unsigned, as to a replica
        that holds no key)."""
        self.timeout_s = timeout_s
        self.keys = keys
        self._log = OncePerChange(warn)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="direct-notice")
        self._lock = threading.Lock()
        #: Per replica URL, its open connection and the lock that gives it one post at a time.
        self._conns: dict[str, tuple[threading.Lock, list[http.client.HTTPConnection]]] = {}
        #: Posts by what came back: the worker's outcome (``applied``, ``duplicate``, ...),
        #: ``http_<status>`` or ``unreachable``.
        self.counters: dict[str, int] = {}

    def send(self, notice: PreemptionNotice, urls: Iterable[str]) -> list[Future[str]]:
        """Post ``notice`` to every URL; the futures give each post's outcome."""
        body = encode(notice)
        headers = {"Content-Type": "application/json"}
        if self.keys is not None:
            headers.update(self.keys.ring.sign_request(body, wall_ms()))
        return [self._pool.submit(self._post, url, body, headers) for url in urls]

    def warm(self, urls: Iterable[str]) -> None:
        """Open the connections to ``urls`` now, on the pool's threads, so that the first
        notice to each does not wait for a handshake (one that fails is tried again then)."""
        for url in urls:
            self._pool.submit(self._warm, url)

    def close(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
        with self._lock:
            conns, self._conns = self._conns, {}
        for _, held in conns.values():
            for conn in held:
                conn.close()

    def _slot(self, url: str) -> tuple[threading.Lock, list[http.client.HTTPConnection]]:
        with self._lock:
            slot = self._conns.get(url)
            if slot is None:
                slot = self._conns[url] = (threading.Lock(), [])
            return slot

    def _connection(self, url: str) -> http.client.HTTPConnection:
        parts = urlsplit(url)
        cls = (http.client.HTTPSConnection if parts.scheme == "https"
               else http.client.HTTPConnection)
        return cls(parts.hostname or "127.0.0.1", parts.port, timeout=self.timeout_s)

    def _warm(self, url: str) -> None:
        lock, held = self._slot(url)
        with lock:
            if held:
                return
            conn = self._connection(url)
            try:
                conn.connect()
            except OSError:
                conn.close()
                return
            held.append(conn)

    def _post(self, url: str, body: bytes, headers: dict[str, str]) -> str:
        lock, held = self._slot(url)
        with lock:
            try:
                outcome = self._exchange(url, held, body, headers)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                outcome = "unreachable"
                self._problem(url, f"unreachable ({type(exc).__name__}: {exc})")
        with self._lock:
            self.counters[outcome] = self.counters.get(outcome, 0) + 1
            if outcome == "unreachable" and not held:
                # a replica gone keeps no slot: replicas come and go for the poster's life
                self._conns.pop(url, None)
        return outcome

    def _exchange(self, url: str, held: list[http.client.HTTPConnection], body: bytes,
                  headers: dict[str, str]) -> str:
        """One post on the kept connection, or on a new one if the kept one has gone; the
        connection stays for the next post only after a whole answer."""
        path = urlsplit(url).path.rstrip("/") + NOTICE_PATH
        kept = held.pop() if held else None
        if kept is not None:
            try:
                return self._answer(url, kept, held, path, body, headers)
            except (OSError, http.client.HTTPException):
                kept.close()      # closed by the replica since: post again on a new one
        return self._answer(url, self._connection(url), held, path, body, headers)

    def _answer(self, url: str, conn: http.client.HTTPConnection,
                held: list[http.client.HTTPConnection], path: str, body: bytes,
                headers: dict[str, str]) -> str:
        try:
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
        except BaseException:
            conn.close()
            raise
        if response.will_close:
            conn.close()
        else:
            held.append(conn)
        if response.status == 200:
            self._log.fine(url)
            return str(json.loads(payload).get("outcome", "unknown"))
        self._problem(url, f"answered {response.status}: {payload[:200]!r}")
        return f"http_{response.status}"

    def _problem(self, url: str, what: str) -> None:
        self._log.problem(url, f"preemption notice to {url}{NOTICE_PATH} not taken: {what}; "
                               f"the Kafka copy still reaches it")
