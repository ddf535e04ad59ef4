"""The client's Kafka side: the targets and replicas it follows, and the records it sends.

The feeds read on daemon threads and hand every message to the client's event loop
(`on_loop`): the client's policy state is not locked, so it is only touched there. Starting
waits, bounded by ``catch_up_timeout_s``, until each feed has read its topic to the end, so
the first requests use targets (and the live set) rather than serving baseline only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from schemas import kafka_clients
from schemas.contract import ControlTargets, ReplicaAnnouncement
from schemas.kafka_config import KafkaSettings
from workers.client.config import ClientConfig
from workers.client.feed import MembershipFeed, Refuse, TargetsFeed
from workers.client.records import RecordQueue


def on_loop(loop: asyncio.AbstractEventLoop, apply: Callable[..., None], *args: Any) -> None:
    """Feed thread -> event loop: policy state is only touched on the loop."""
    if not loop.is_closed():
        with contextlib.suppress(RuntimeError):     # loop closing under us
            loop.call_soon_threadsafe(apply, *args)


class KafkaSide:
    """The record queue with its flush timer, and the feeds; use it from the client's loop.

    :param config: the client's config (scope, catch-up timeout, batching).
    :param kafka: the cluster and topic prefix.
    :param bump: counts ``n`` units of a class for a reason (`Decider.bump`).
    """

    def __init__(self, config: ClientConfig, kafka: KafkaSettings,
                 bump: Callable[[str, str, int], None]) -> None:
        self.config = config
        self.kafka = kafka
        self._bump = bump
        self.records: RecordQueue | None = None
        self.feed: TargetsFeed | None = None
        self.membership_feed: MembershipFeed | None = None
        self._flusher: asyncio.Task[None] | None = None

    def open_records(self) -> RecordQueue:
        """Open the producer and its record queue, flushed by a timer for a quiet client."""
        producer = kafka_clients.producer(self.kafka, **{"client.id": "surplus-ranking-client"})
        records = self.records = RecordQueue(self.config, self.kafka, producer, self._bump)
        self._flusher = asyncio.create_task(records.flush_every())
        return records

    async def follow(self, on_targets: Callable[[ControlTargets, Refuse], None],
                     on_announcement: Callable[[str, ReplicaAnnouncement | None], None] | None,
                     ) -> None:
        """Start the targets feed (and, given ``on_announcement``, the membership feed), each
        dead-lettering through the record queue, and wait for them to catch up.

        :param on_targets: applies a target, on the loop.
        :param on_announcement: applies a replica's announcement or tombstone, on the loop.
        """
        records = self.records
        assert records is not None, "open_records first: the feeds dead-letter through it"
        loop = asyncio.get_running_loop()
        self.feed = TargetsFeed(self.kafka, self.config.scope,
                                lambda targets, refuse: on_loop(loop, on_targets, targets,
                                                                refuse),
                                records.dead_letter)
        self.feed.start()
        if on_announcement is not None:
            self.membership_feed = MembershipFeed(
                self.kafka, self.config.scope,
                lambda replica_id, announcement: on_loop(loop, on_announcement, replica_id,
                                                         announcement),
                records.dead_letter)
            self.membership_feed.start()
        if self.config.catch_up_timeout_s > 0:
            for name, feed in (("feed", self.feed), ("membership", self.membership_feed)):
                if feed is None:
                    continue
                caught_up = await asyncio.to_thread(feed.caught_up.wait,
                                                    self.config.catch_up_timeout_s)
                if not caught_up:
                    self._bump(name, "catch_up_timeout", 1)

    async def stop(self) -> None:
        """Stop the flush timer and the feeds. The records still queued are sent by the
        queue's own close, which the client calls after closing its HTTP pool."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
        if self.feed is not None:
            await asyncio.to_thread(self.feed.stop)
        if self.membership_feed is not None:
            await asyncio.to_thread(self.membership_feed.stop)
