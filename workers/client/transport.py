"""How `RankingClient` reaches a pool's replicas: which replica is next, which ones to skip for
a while, and one HTTP call with its body in the configured encoding.

Policy stays with the client: this module says what happened to a call (a `RankResponse`, or
`CallFailed` with a short reason) and the client feeds that to shedding and fallback. The
request body is msgpack by default (`workers.wire`: candidates as raw numpy columns, so the
worker, the shared and scarce side, decodes them with a few copies) or JSON with
``encoding = "json"``; the response is read in whichever of the two the worker answered.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection, Iterator, Mapping

import aiohttp

from schemas.codec import ContractError
from workers.api import RANK_PATH, RankRequest, RankResponse
from workers.policy.membership import Membership
from workers.policy.routing import Model
from workers.wire import (
    ACCEPT_MSGPACK,
    CONTENT_TYPES,
    JSON_TYPE,
    Encoding,
    FeatureValue,
    decode_rank_response,
    encode_rank_request,
    take_features,
)

#: Baseline call failures worth another replica: it was not reached ("connection"), it went
#: away with the request in flight ("disconnected"), or it is not serving ("http_503"). One
#: that is slow or frozen is not failed but hedged (`workers.policy.baseline_retry`).
RETRY_ON_ANOTHER_REPLICA = frozenset({"connection", "disconnected", "http_503"})


class CallFailed(Exception):
    """One call to one replica did not give a usable response; `reason` says why
    (``connection``, ``disconnected``, ``timeout``, ``http_<status>``, ``bad_response``,
    ``wrong_request_id``, ``no_replica``, ``client``), and `url` which replica it was (None
    when none was picked)."""

    def __init__(self, reason: str, url: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.url = url


class Transport:
    """The replicas of each pool, taken in turn, and the HTTP calls to them.

    Use it from one event loop (the client's). Open it with `open` before the first call.
    """

    def __init__(self, pools: dict[Model, tuple[str, ...]], *, encoding: Encoding,
                 replica_down_s: float, membership: Membership | None = None,
                 clock: Callable[[], int]) -> None:
        """
        :param pools: the fixed base URLs of each pool (with membership: the fallback while
            the replicas topic names no live replica of that pool).
        :param encoding: the request bodies' encoding (`workers.wire`).
        :param replica_down_s: how long a replica that refused or dropped a connection, or
            said it is not ready, is skipped while another of its pool is left.
        :param membership: the live set from the replicas topic, or None for fixed pools.
        :param clock: wall-clock milliseconds, for the membership's leases.
        """
        self._fixed = {m: tuple(u.rstrip("/") + RANK_PATH for u in urls)
                       for m, urls in pools.items()}
        self._turn: dict[Model, Iterator[int]] = {m: itertools.count() for m in pools}
        self._encoding = encoding
        self._headers = ({"content-type": CONTENT_TYPES["msgpack"], "accept": ACCEPT_MSGPACK}
                         if encoding == "msgpack"
                         else {"content-type": JSON_TYPE, "accept": JSON_TYPE})
        self._replica_down_s = replica_down_s
        self._membership = membership
        self._clock = clock
        self._rank_urls: dict[tuple[str, ...], tuple[str, ...]] = {}
        #: Replicas that refused or dropped a connection, skipped until this perf_counter time.
        self._down_until: dict[str, float] = {}
        self._session: aiohttp.ClientSession | None = None

    def open(self, max_connections: int) -> None:
        """Open the HTTP connection pool (`max_connections` per worker host)."""
        connector = aiohttp.TCPConnector(limit_per_host=max_connections)
        self._session = aiohttp.ClientSession(connector=connector)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def pool_urls(self, model: Model) -> tuple[str, ...]:
        """The rank URLs of a pool now: its live replicas with membership (the fixed list
        while none is live), else the fixed list."""
        if self._membership is not None:
            live = self._membership.routable(model, self._clock())
            if live:
                urls = self._rank_urls.get(live)
                if urls is None:
                    if len(self._rank_urls) > 64:
                        self._rank_urls.clear()
                    urls = self._rank_urls[live] = tuple(e + RANK_PATH for e in live)
                return urls
        return self._fixed[model]

    def mark_down(self, url: str, seconds: float) -> None:
        """Skip a replica (its rank URL, `CallFailed.url`) for `seconds`, while another of its
        pool is left: one that a hedge on another replica beat (`baseline_retry`), or a
        powerful one that did not answer within the powerful wait."""
        if seconds > 0.0:
            self._down_until[url] = max(self._down_until.get(url, 0.0),
                                        time.perf_counter() + seconds)

    def pick(self, model: Model, avoid: Collection[str] = ()) -> str | None:
        """The next replica of a pool in turn (None: the pool has none), skipping ones that
        just failed to connect, said they are not ready, lost a hedge or (powerful) timed out
        (while another is left): a dead, starting, draining or frozen replica costs one call
        per skip time.
        Replicas in `avoid` (tried already for this request) come after every other."""
        urls = self.pool_urls(model)
        if not urls:
            return None
        turn = next(self._turn[model])
        url = urls[turn % len(urls)]
        if not self._down_until and not avoid:
            return url
        now = time.perf_counter()
        for step in range(1, len(urls) + 1):
            if url not in avoid and self._down_until.get(url, 0.0) <= now:
                return url
            url = urls[(turn + step) % len(urls)]
        for step in range(len(urls)):    # every one down or tried: one not tried, if any
            if urls[(turn + step) % len(urls)] not in avoid:
                return urls[(turn + step) % len(urls)]
        return url

    async def call(self, model: Model, request: RankRequest, timeout_s: float,
                   features: Mapping[str, FeatureValue] | None = None,
                   url: str | None = None) -> RankResponse:
        """POST one request to a replica of a pool and read its answer.

        ``features`` are the model's named inputs for the caller's candidates: those of the
        candidates `request` carries go with it (`workers.wire.take_features`). ``url``: the
        replica's rank URL (`pick`); None: the next replica in turn.

        :raise CallFailed: the call gave no usable response (the reason names how).
        :raise ContractError: the request cannot be encoded (msgpack: candidates of different
            sparse widths, a value that is not a number); raised before any I/O.
        """
        assert self._session is not None, "Transport.open() was not called"
        if features:
            features = take_features(features, len(request.candidates))
        body = encode_rank_request(request, self._encoding, features)
        url = url or self.pick(model)
        if url is None:
            raise CallFailed("no_replica")     # no live replica of this pool (membership)
        try:
            async with self._session.post(
                    url, data=body, headers=self._headers,
                    timeout=aiohttp.ClientTimeout(total=timeout_s)) as http:
                payload = await http.read()
                if http.status != 200:
                    if http.status == 503 and model == "baseline":
                        # Not ready (starting, draining): ask the others for a while.
                        self._down_until[url] = time.perf_counter() + self._replica_down_s
                    raise CallFailed(f"http_{http.status}", url)
                content_type = http.headers.get("content-type")
            response = decode_rank_response(payload, content_type)
        except TimeoutError:
            raise CallFailed("timeout", url) from None
        except ContractError:
            raise CallFailed("bad_response", url) from None
        except aiohttp.ClientError as exc:
            reason = ("disconnected" if isinstance(exc, aiohttp.ServerDisconnectedError)
                      else "connection" if isinstance(exc, aiohttp.ClientConnectionError)
                      else "client")
            if reason != "client":
                self._down_until[url] = time.perf_counter() + self._replica_down_s
            raise CallFailed(reason, url) from None
        if response.request_id != request.request_id:
            raise CallFailed("wrong_request_id", url)
        return response
