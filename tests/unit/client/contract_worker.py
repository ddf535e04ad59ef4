"""A small worker speaking the ranking contract over real HTTP, for client tests: it scores by
prior and has a knob for each way a real worker can misbehave (slow, failing, shedding). It
reads JSON and msgpack bodies and answers in what Accept asks for, as the real one does."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.test_utils import TestServer

from schemas.contract import ModelKind as Model
from workers.api import RANK_PATH, RankRequest, RankResponse, ServerState
from workers.wire import (
    CONTENT_TYPES,
    ColumnarRequest,
    Encoding,
    decode_rank_request,
    encode_rank_response,
    request_encoding,
    response_encoding,
)


@dataclass
class Worker:
    """A test worker: scores by prior, with a knob for each way a real worker can misbehave."""

    model: Model
    delay_s: float = 0.0
    status: int = 200
    shedding_level: int = 0
    shed_optional: bool = False
    #: The room for extras it reports to a request that asks (None: it says nothing).
    room: int | None = None
    #: Answer in this encoding whatever Accept asks for (None: as Accept asks).
    answer: Encoding | None = None
    seen: list[RankRequest] = field(default_factory=list)
    #: The encoding of each request body seen, and the one each answer was asked in.
    encodings: list[tuple[Encoding, Encoding]] = field(default_factory=list)

    async def handle(self, http: web.Request) -> web.Response:
        encoding = request_encoding(http.headers.get("content-type"))
        assert encoding is not None, http.headers.get("content-type")
        body = decode_rank_request(await http.read(), encoding)
        request = body.to_request() if isinstance(body, ColumnarRequest) else body
        answer = self.answer or response_encoding(http.headers.get("accept"))
        self.seen.append(request)
        self.encodings.append((encoding, answer))
        await asyncio.sleep(self.delay_s)
        if self.status != 200:
            return web.Response(status=self.status)
        kept = request.candidates[:request.base_count] if self.shed_optional \
            else request.candidates
        response = RankResponse(
            request_id=request.request_id, model=self.model,
            scores=[c.prior for c in kept], scored=len(kept),
            optional_scored=len(kept) - request.base_count,
            optional_shed=len(request.candidates) - len(kept),
            shed_reason="overload" if self.shed_optional else None,
            server=ServerState(queue_delay_ms=0.5, in_flight=1,
                               shedding_level=self.shedding_level,
                               optional_room=self.room if request.report_room else None))
        return web.Response(body=encode_rank_response(response, answer),
                            content_type=CONTENT_TYPES[answer])


async def serve(worker: Worker) -> TestServer:
    """Start `worker` on a free loopback port; the caller closes the returned server."""
    app = web.Application()
    app.router.add_post(RANK_PATH, worker.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server
