"""The README's ten lines of client code, and the same block on the docs site, run as written:
they rank a request through `RankingClient` against a stub worker (no Kafka: baseline only)."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from workers.api import RANK_PATH, RankResponse, ServerState, encode
from workers.client.client import RankingClient
from workers.client.config import ClientConfig
from workers.wire import ColumnarRequest, decode_rank_request, request_encoding

ROOT = Path(__file__).resolve().parents[2]


def _snippet(path: Path) -> str:
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
    assert blocks, f"{path.name} has no python block"
    return blocks[0]


def test_readme_and_docs_show_the_same_client_block() -> None:
    assert _snippet(ROOT / "README.md") == _snippet(ROOT / "docs" / "client.md")


@pytest.mark.parametrize("path", ["README.md", "docs/client.md"])
async def test_the_client_block_ranks_a_request(path: str) -> None:
    async def handle(http: web.Request) -> web.Response:
        body = decode_rank_request(await http.read(),
                                   request_encoding(http.headers.get("content-type")) or "json")
        request = body.to_request() if isinstance(body, ColumnarRequest) else body
        response = RankResponse(
            request_id=request.request_id, model="baseline",
            scores=[c.prior for c in request.candidates], scored=len(request.candidates),
            optional_scored=0, optional_shed=len(request.candidates) - request.base_count,
            server=ServerState(queue_delay_ms=0.5, in_flight=1, shedding_level=0))
        return web.Response(body=encode(response), content_type="application/json")

    app = web.Application()
    app.router.add_post(RANK_PATH, handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    namespace: dict[str, object] = {}
    exec(compile(_snippet(ROOT / path), path, "exec"), namespace)
    url = str(server.make_url("")).rstrip("/")
    written = namespace["config"]
    assert isinstance(written, ClientConfig)
    config = msgspec.structs.replace(written, baseline_urls=[url], powerful_urls=[url])
    items = [(i, [i], i / 200) for i in range(120)]
    try:
        async with RankingClient(config) as client:
            scores = await namespace["rank"](client, items)  # type: ignore[operator]
    finally:
        await server.close()
    assert scores == [i / 200 for i in range(100)]  # no targets: the 100 baseline candidates
