"""What a `RankingClient` writes to Kafka: its decision records and labels, batched, and the
dead letters of its feeds.

Decision records (RoutingOutcome) go out as one outcomes message a batch, keyed by the scope,
when the batch is full (``decision_batch_max``) or older than the linger
(``decision_linger_ms``), checked per record and by a timer for a quiet client. Labels share
that linger and go to the labels topic on the partition of the client's scope: a batch keyed
by the scope, a lone label by its request id. Every record is counted by what came of it
(``published``, ``delivery_failed``, ``dropped_queue_full``...) through the decider's
counters, so nothing is lost silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from schemas.codec import encode as encode_event
from schemas.codec import encode_outcomes
from schemas.contract import DeadLetter, OutcomeLabel, RoutingOutcome
from schemas.kafka_clients import KafkaError, Producer
from schemas.kafka_config import KafkaSettings
from schemas.topics import scope_partition, spec
from workers.client.config import ClientConfig


class RecordQueue:
    """Decision records and labels waiting to be sent, and the producer that sends them.

    Use it from the client's event loop, except `dead_letter` (the feeds' threads; the
    producer is thread-safe) and the delivery callbacks (inside ``poll``/``flush``).

    :param config: the client's config (scope, batch size, linger).
    :param kafka: the cluster and topic prefix.
    :param producer: the client's producer.
    :param bump: counts ``n`` units of a class for a reason (`Decider.bump`).
    """

    def __init__(self, config: ClientConfig, kafka: KafkaSettings, producer: Producer,
                 bump: Callable[[str, str, int], None]) -> None:
        self.config = config
        self.kafka = kafka
        self.producer = producer
        self.bump = bump
        #: Decision records and labels not yet sent, and when the oldest of them was queued.
        self._batch: list[RoutingOutcome] = []
        self._labels: list[OutcomeLabel] = []
        self._since = 0.0
        self._labels_partition = scope_partition(config.scope, spec("labels").partitions)

    def decision(self, record: RoutingOutcome) -> None:
        """Queue a request's decision record; a full batch, or one older than the linger,
        goes out as one message."""
        self._queue(self._batch, record)

    def label(self, label: OutcomeLabel) -> None:
        """Queue a label, batched as decisions are."""
        self._queue(self._labels, label)

    def _queue(self, queue: list[Any], item: RoutingOutcome | OutcomeLabel) -> None:
        if not self._batch and not self._labels:
            self._since = time.perf_counter()
        queue.append(item)
        if len(queue) >= self.config.decision_batch_max or self._lingered():
            self.flush()

    def _lingered(self) -> bool:
        return (time.perf_counter() - self._since) * 1000.0 >= self.config.decision_linger_ms

    async def flush_every(self) -> None:
        """A quiet client's decisions go out within the linger too (a task until cancelled)."""
        linger_s = max(self.config.decision_linger_ms, 10.0) / 1000.0
        while True:
            await asyncio.sleep(linger_s)
            if (self._batch or self._labels) and self._lingered():
                self.flush()

    def flush(self) -> None:
        """Send the decision records queued so far as one outcomes message, and the labels
        as one labels message (keyed by the scope; a lone label by its request id)."""
        producer, batch = self.producer, self._batch
        if self._labels:
            self._flush_labels()
        if not batch:
            return
        self._batch = []
        n = len(batch)
        try:
            producer.produce(self.kafka.topic("outcomes"), key=self.config.scope,
                             value=encode_outcomes(batch),
                             on_delivery=lambda err, _msg: self._delivered(err, _msg, n))
        except BufferError:
            self.bump("outcomes", "dropped_queue_full", n)
        except Exception:
            self.bump("outcomes", "dropped_error", n)
        producer.poll(0)

    def _delivered(self, err: KafkaError | None, _msg: Any, n: int = 1) -> None:
        # Runs inside producer.poll()/flush(), on whichever thread called them.
        self.bump("outcomes", "published" if err is None else "delivery_failed", n)
        if err is None:
            self.bump("outcomes", "batches", 1)

    def _flush_labels(self) -> None:
        labels, self._labels = self._labels, []
        one = len(labels) == 1
        try:
            self.producer.produce(
                self.kafka.topic("labels"),
                key=labels[0].request_id if one else self.config.scope,
                value=encode_event(labels[0]) if one else encode_outcomes(labels),
                partition=self._labels_partition)
            self.bump("labels", "sent", len(labels))
        except BufferError:
            self.bump("labels", "dropped_queue_full", len(labels))
        self.producer.poll(0)

    def dead_letter(self, letter: DeadLetter) -> None:
        """Called on a feed's thread: the producer is thread-safe."""
        with contextlib.suppress(BufferError):
            self.producer.produce(self.kafka.topic("deadletter"), key=letter.source_topic,
                                  value=encode_event(letter))

    async def close(self) -> None:
        """Send what is queued and wait up to 5 s for the broker; what it did not take is
        counted (``undelivered_at_close``)."""
        self.flush()
        undelivered = await asyncio.to_thread(self.producer.flush, 5.0)
        if undelivered:
            self.bump("outcomes", "undelivered_at_close", undelivered)
