"""What the agents tests share: a Faust app's producer on the real broker, bounded both ways."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import faust


@contextlib.asynccontextmanager
async def producing(app: faust.App) -> AsyncIterator[faust.App]:
    """The app's producer started, then stopped at the end; a hang fails the test, not the
    session (pytest-timeout would end the whole run)."""
    await asyncio.wait_for(app.maybe_start_producer(), timeout=30)
    try:
        yield app
    finally:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(app.producer.stop(), timeout=15)
