"""The client's Kafka side (``workers.client.kafka_side``): a feed thread's message is applied
on the client's loop, and a closed loop drops it rather than raising in the feed."""

from __future__ import annotations

import asyncio
import threading

from workers.client.kafka_side import on_loop


async def test_a_message_from_a_feed_thread_is_applied_on_the_loop() -> None:
    loop = asyncio.get_running_loop()
    applied = asyncio.Event()
    seen: list[tuple[str, threading.Thread]] = []

    def apply(message: str) -> None:
        seen.append((message, threading.current_thread()))
        applied.set()

    feed = threading.Thread(target=on_loop, args=(loop, apply, "t1"))
    feed.start()
    feed.join()
    await asyncio.wait_for(applied.wait(), 5.0)
    assert seen == [("t1", threading.current_thread())]


def test_a_closed_loop_drops_the_message() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    seen: list[str] = []
    on_loop(loop, seen.append, "t1")
    assert seen == []
