"""The aiokafka transport with a short broker-side fetch wait.

Faust's aiokafka driver asks the broker to hold each fetch up to 1.5 s. Once a busy partition
has buffered records, aiokafka's next fetch names only the partitions without buffered data,
which for the control plane are the quiet ones (capacity, preemption, outcomes, ticks); the
broker then holds that fetch the full 1.5 s while the busy partition waits for its turn. Measured
here with an empty agent: 11.7k events/s on one topic, 3.7k/s once one empty topic is also
subscribed. A 20 ms wait keeps the busy partition flowing and costs a few idle fetches a second.
"""

from __future__ import annotations

from typing import Any

from faust.transport.drivers import TRANSPORTS
from faust.transport.drivers import aiokafka as faust_aiokafka

FETCH_MAX_WAIT_MS = 20
SCHEME = "surplus-kafka"


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        consumer._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Transport(faust_aiokafka.Transport):
    """Use with broker URLs `surplus-kafka://host:port`."""

    Consumer = _Consumer


TRANSPORTS.aliases[SCHEME] = f"{__name__}:Transport"
