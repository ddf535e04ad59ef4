"""The live capacity scheduler: sends a schedule's grants, renewals, revokes and preemption
notices (``sim.schedule``, the one the simulator publishes) to Kafka at their time, stamped
when they really leave.

It stands in for the cluster scheduler that lends idle capacity to Surplus. Each message is
flushed as it is sent (a few a second at most), so a notice's ``ts_ms`` is within a
millisecond or two of the moment it was on its way: workers measure their reaction from it.
On stop, every pool still lent is revoked, so the run ends with no capacity on the books.

A notice also goes straight to the replicas it reclaims, ``POST /v1/preempt`` on the
endpoints their membership announces (``ReplicaDirectory``, ``workers.capacity.direct``), as
Kubernetes calls a pod's preStop hook: they stop optional work without waiting for Kafka's
delivery, and apply the Kafka copy that follows as a duplicate.

With a keyring every grant, revoke and notice is signed before it leaves (and each direct post
carries its request signature), so receivers holding the key take them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from schemas import kafka_clients
from schemas.clock import wall_ms, wall_ms_at_edge
from schemas.codec import encode
from schemas.contract import PreemptionNotice, ReplicaAnnouncement
from schemas.kafka_config import KafkaSettings
from schemas.signing import KeySource
from sim.schedule import Action, Outbox
from workers.capacity.direct import DirectNotices
from workers.client.feed import MembershipFeed
from workers.policy.membership import Membership


@dataclass
class SchedulerStats:
    sent: dict[str, int] = field(default_factory=dict)
    failed: int = 0
    first_error: str | None = None
    #: Notices posted straight to replicas, by what each answered (see ``DirectNotices``).
    direct: dict[str, int] = field(default_factory=dict)


class SchedulerMetrics:
    """What Prometheus/Grafana plot as 'opportunistic capacity': units lent per pool."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.lent = Gauge("surplus_scheduler_lent_units", "Accelerator units lent, by pool",
                          ["pool"], registry=self.registry)
        self.messages = Counter("surplus_scheduler_messages", "Messages sent, by kind",
                                ["kind"], registry=self.registry)

    def sent(self, action: Action) -> None:
        self.messages.labels(action.kind).inc()
        if action.lent_after is not None:
            self.lent.labels(action.pool_id).set(action.lent_after)


class ReplicaDirectory:
    """Where each replica listens, from the replicas topic (followed on a feed thread)."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self._members = Membership()
        self._lock = threading.Lock()
        self._feed = MembershipFeed(kafka, "scheduler", self._deliver)
        #: Called with each endpoint a replica announces for the first time (the poster
        #: opens its connection then, ahead of the first notice).
        self.on_endpoint: Callable[[str], None] | None = None

    def start(self) -> None:
        self._feed.start()

    def stop(self) -> None:
        self._feed.stop()

    def urls(self, notice: PreemptionNotice) -> tuple[str, ...]:
        with self._lock:
            return self._members.reclaimed(notice, wall_ms())

    def _deliver(self, replica_id: str, announcement: ReplicaAnnouncement | None) -> None:
        with self._lock:
            if announcement is None:
                self._members.withdraw(replica_id)
                return
            known = self._members.members().get(replica_id)
            self._members.offer(announcement, wall_ms())
        if self.on_endpoint is not None and (known is None
                                             or known.endpoint != announcement.endpoint):
            self.on_endpoint(announcement.endpoint)


class Scheduler:
    """Sends ``actions`` relative to ``start_ms`` until they run out or ``stop`` is set."""

    def __init__(self, actions: list[Action], kafka: KafkaSettings, start_ms: int, *,
                 say: Callable[[str], None] = print, metrics_port: int = 0,
                 metrics_host: str = "127.0.0.1",
                 directory: ReplicaDirectory | None = None,
                 keys: KeySource | None = None) -> None:
        """``directory``: post each notice to the replicas it reclaims too (None: Kafka only).
        ``keys``: sign every message with this keyring (None: unsigned)."""
        self.actions = actions
        self.keys = keys
        #: Where to post notices, and the poster (None: Kafka only).
        self._direct: tuple[ReplicaDirectory, DirectNotices] | None = None
        if directory is not None:
            poster = DirectNotices(warn=say, keys=keys)
            directory.on_endpoint = lambda url: poster.warm([url])
            self._direct = (directory, poster)
        self.kafka = kafka
        self.start_ms = start_ms
        self.say = say
        self.stats = SchedulerStats()
        self.metrics = SchedulerMetrics()
        if metrics_port:
            start_http_server(metrics_port, addr=metrics_host, registry=self.metrics.registry)
        self._producer = kafka_clients.notice_producer(kafka,
                                                       **{"client.id": "surplus-scheduler"})
        self._outbox = Outbox()

    def run(self, stop: threading.Event, end_ms: int | None = None) -> SchedulerStats:
        """Send each action at its time until ``end_ms``; then (or on stop) revoke what is
        still lent."""
        stopped = False
        for action in self.actions:
            if end_ms is not None and action.at_ms >= end_ms:
                break
            stopped = self._wait_until(action.at_ms, stop)
            if stopped:
                break
            self._send(action)
        if end_ms is not None and not stopped:
            self._wait_until(end_ms, stop)
        for action in self._outbox.closing(wall_ms() - self.start_ms):
            self._send(action)
        self.stats.failed += self._producer.flush(10)
        if self._direct is not None:
            poster = self._direct[1]
            poster.close()
            self.stats.direct = dict(sorted(poster.counters.items()))
        return self.stats

    def _wait_until(self, at_ms: int, stop: threading.Event) -> bool:
        """Wait until ``at_ms`` into the run; True if ``stop`` was set meanwhile."""
        wait_s = (self.start_ms + at_ms - wall_ms()) / 1000.0
        return wait_s > 0 and stop.wait(wait_s)

    def _send(self, action: Action) -> None:
        # a notice's stamp is what its reaction is measured from: taken as a millisecond begins
        now = wall_ms_at_edge() if action.kind == "notice" else wall_ms()
        event = self._outbox.stamp(action, now)
        if self.keys is not None:
            event = self.keys.sign(event)
        if self._direct is not None and isinstance(event, PreemptionNotice):
            directory, poster = self._direct
            poster.send(event, directory.urls(event))  # on its threads; Kafka's copy next
        self._producer.produce(self.kafka.topic(action.topic), key=action.region,
                               value=encode(event), on_delivery=self._delivered)
        self._producer.flush(5.0)
        self.stats.sent[action.kind] = self.stats.sent.get(action.kind, 0) + 1
        self.metrics.sent(action)
        self.say(f"t={(now - self.start_ms) / 1000:7.2f}s {action.kind:6} {action.pool_id} "
                 f"replicas={action.replicas}"
                 + (f" notice={action.notice_ms}ms" if action.kind == "notice" else ""))

    def _delivered(self, err: object, _msg: object) -> None:
        if err is not None:
            self.stats.failed += 1
            self.stats.first_error = self.stats.first_error or str(err)
