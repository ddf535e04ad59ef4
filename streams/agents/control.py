"""The control agents: each input topic of a scope reaches the controller of its owner.

All input topics are keyed by scope and co-partitioned, so the agents of the four input topics
(one per concern) see every event of a scope in the process that owns its partition. Ticks are
messages too: a timer sends one to each partition this process owns, and the tick agent ticks
the scopes stored on that partition, so only the owner of a scope ever runs its controllers.

With ``stages = 2`` telemetry is the exception: keyed by replica, a scope's reports reach every
process, whose first stage sums them per period and sends the parts, keyed by scope, to the
plane's partials topic; the scope's owner closes a period once its parts are in, not on its
tick (``streams.agents.stages``).

Controller state lives in a compacted changelog topic, partitioned like the inputs: written
after every tick and every capacity or preemption event (before the targets it produced are
published), read back for a partition when this process is assigned it. That is the job of a
Faust Table; the explicit version is kept because merely having a Table in the app cost ~15%
of ingest throughput here (the agents then share the consumer with its changelog), and its read-back
waits out a cluster that is still electing leaders after an outage instead of crashing the
worker (tests/faults/test_broker_outage.py).

The label join's pending decisions are kept apart from that snapshot, in RocksDB under the
process's data directory with a changelog topic of their own (`streams.agents.pending`): they
grow with the request rate, so they are held on disk, written as they arrive and read back
for a newly assigned partition, before its agents take another event, from where this
process's disk left off (all of it on a disk that has none).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import faust
import msgspec

from schemas.clock import wall_ms
from schemas.codec import (
    ContractError,
    decode,
    decode_labels,
    decode_outcomes,
    decode_telemetry,
    encode,
)
from schemas.contract import (
    ControlTargets,
    DeadLetter,
    Event,
    OperatorOverride,
    OutcomeLabel,
    WindowPartial,
)
from schemas.kafka_clients import KafkaException, TopicUnavailable
from schemas.kafka_config import KafkaSettings
from schemas.keywatch import KeyReloader
from schemas.topics import scope_partition
from streams.agents import health
from streams.agents.changelog import read_changelog
from streams.agents.metrics import Metrics
from streams.agents.pending import DiskSettings, PendingChangelog, changelog_config
from streams.agents.stages import FirstStage, SecondStage, encode_part
from streams.control.config import ControlConfig
from streams.control.controller import ScopeController
from streams.control.dispatch import (
    INPUTS,
    REFUSALS,
    RULES,
    Rejected,
    Rule,
    authenticate,
    dispatch_all,
    key_mismatch,
)
from streams.control.override import describe
from streams.scopes import ScopeRegistry
from streams.settings import ControlPlaneSettings

log = logging.getLogger(__name__)

#: Longest wait between two tries at reading stored state back (``_until_read``).
RESTORE_RETRY_MAX_S = 5.0
T = TypeVar("T")


def internal_topics(kafka: KafkaSettings, settings: ControlPlaneSettings) -> tuple[str, str]:
    """The control plane's own topics: ticks (cleanup ``delete``) and the scope changelog
    (cleanup ``compact``)."""
    base = f"{kafka.prefix}{settings.app_id}"
    return f"{base}-ticks", f"{base}-scopes-changelog"


def pending_topic(kafka: KafkaSettings, settings: ControlPlaneSettings) -> str:
    """The changelog of the label join's pending decisions (``pending.changelog_config``)."""
    return f"{kafka.prefix}{settings.app_id}-pending-changelog"


def partials_topic(kafka: KafkaSettings, settings: ControlPlaneSettings) -> str:
    """Two stages: the first stage's per-period parts, keyed by scope (cleanup ``delete``)."""
    return f"{kafka.prefix}{settings.app_id}-partials"


class Tick(msgspec.Struct, frozen=True):
    ts_ms: int


class ControlPlane:
    """Topics, table, agent and timer of one control-plane app."""

    def __init__(self, app: faust.App, kafka: KafkaSettings, settings: ControlPlaneSettings,
                 config: ControlConfig) -> None:
        self.app = app
        self.kafka = kafka
        self.config = config
        self.metrics = Metrics()
        self.names = {kafka.topic(logical): logical for logical in INPUTS}
        raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
                               "value_serializer": "raw"}
        ticks, changelog = internal_topics(kafka, settings)
        self.ticks = app.topic(ticks, internal=True, partitions=settings.partitions, **raw)
        self.targets = app.topic(kafka.topic("targets"), **raw)
        self.estimates = app.topic(kafka.topic("estimates"), **raw)
        self.deadletter = app.topic(kafka.topic("deadletter"), **raw)
        self.changelog = app.topic(changelog, internal=True, partitions=settings.partitions,
                                   compacting=True, deleting=False, **raw)
        pending_config = changelog_config(config)
        self.pending_topic = app.topic(
            pending_topic(kafka, settings), internal=True, partitions=settings.partitions,
            deleting=True,
            retention=timedelta(milliseconds=int(pending_config["retention.ms"])),
            config={"segment.ms": pending_config["segment.ms"]}, **raw)
        #: The join's pending decisions: on disk, with their changelog.
        self.pending = PendingChangelog(
            kafka, self.pending_topic.get_topic_name(), settings.data_dir / "pending",
            DiskSettings(write_buffer_mb=settings.pending_write_buffer_mb,
                         block_cache_mb=settings.pending_block_cache_mb))
        self.registry = ScopeRegistry(config, self.pending.disk.store)
        self.partitions = settings.partitions
        #: Signs the targets published and checks the capacity events, notices and overrides
        #: read (None: signing off); a key directory is re-read while the plane runs.
        self.keys = settings.keys()
        if (self.keys is not None and self.keys.path is not None
                and settings.signing_reload_s > 0):
            reloader = KeyReloader(self.keys)

            async def reload_keys() -> None:
                reloader.poll()

            app.timer(interval=settings.signing_reload_s, name="surplus-control-key-reload")(
                reload_keys)
        self._restoring: dict[int, asyncio.Event] = {}
        self.agents = {logical: app.agent(app.topic(kafka.topic(logical), **raw),
                                          name=f"surplus-control-{logical}")(
                                              self._input_agent(logical))
                       for logical in INPUTS}
        self.agents["ticks"] = app.agent(self.ticks, name="surplus-control-ticks")(
            self._ticks_agent)
        #: Two stages (``settings.stages``): this process's telemetry partitions summed per
        #: period and sent on, and the gates of the scopes it owns (``streams.agents.stages``).
        self.first: FirstStage | None = None
        self.second: SecondStage | None = None
        if settings.stages == 2:
            self._two_stages(app, kafka, settings, config, raw)
        # Half the shortest period in use: a scope with a longer `[scopes.<region>]` period
        # skips the ticks it is not due for (`ScopeRegistry.due`).
        self.tick_interval_ms = config.periods_ms()[0] / 2
        app.timer(interval=self.tick_interval_ms / 1000, name="surplus-control-tick-timer")(
            self._send_ticks)
        app.on_partitions_revoked.connect(self._on_revoked)  # type: ignore[arg-type]
        app.on_before_shutdown.connect(self._on_shutdown)  # type: ignore[arg-type]
        app.on_partitions_assigned.connect(self._on_assigned)  # type: ignore[arg-type]
        #: What /healthz and /readyz judge (``streams.agents.health``), served with /metrics.
        self.health = health.HealthState(period_ms=config.periods_ms()[0],
                                         tick_interval_ms=self.tick_interval_ms)
        if settings.metrics_port:
            health.serve(settings.metrics_host, settings.metrics_port, self.metrics.registry,
                         self.health, wall_ms)

    def _two_stages(self, app: faust.App, kafka: KafkaSettings,
                    settings: ControlPlaneSettings, config: ControlConfig,
                    raw: dict[str, Any]) -> None:
        self.partials = app.topic(partials_topic(kafka, settings), internal=True,
                                  partitions=settings.partitions, deleting=True,
                                  retention=timedelta(hours=1), **raw)

        async def send(part: WindowPartial) -> None:
            key, value = encode_part(part)
            await self.partials.send(key=key, value=value)

        first = self.first = FirstStage(config, send, self.metrics)
        self.second = SecondStage(config, round(settings.stage_grace_s * 1000), self.metrics)
        self.agents["partials"] = app.agent(self.partials, name="surplus-control-partials")(
            self._partials_agent)

        async def flush() -> None:
            await first.flush(wall_ms())

        # Parts go out within a tenth of the shortest period of its end.
        app.timer(interval=config.periods_ms()[0] / 10_000, name="surplus-control-stage-flush")(
            flush)

    def _input_agent(self, logical: str) -> Callable[[faust.StreamT], Awaitable[None]]:
        """The agent of one input topic: decode, then the rulebook (``streams.control.dispatch``):
        check the key against the scope, hand to its controller, persist and publish."""
        rule = RULES[logical]
        events = self.metrics.events.labels(logical)

        async def agent(stream: faust.StreamT) -> None:
            async for event in stream.events():
                message = event.message
                events.inc()
                if self._restoring:
                    await self._restored(message.partition)
                scope = event.key.decode(errors="replace") if event.key else ""
                try:
                    await self._on_input(rule, scope, event.value, message.partition)
                except ContractError as exc:
                    await self._dead_letter(message, exc.reason)
                except Rejected as exc:
                    await self._dead_letter(message, str(exc), label=exc.reason)

        agent.__name__ = agent.__qualname__ = f"{logical}_agent"
        return agent

    async def _on_input(self, rule: Rule, scope: str, value: bytes, partition: int) -> None:
        values: Sequence[Event] = (decode_telemetry(value) if rule.topic == "telemetry"
                                   else decode_outcomes(value) if rule.topic == "outcomes"
                                   else decode_labels(value) if rule.topic == "labels"
                                   else (decode(rule.value_type, value),))
        if self.first is not None and rule.topic == "telemetry":
            self.first.take(partition, scope or None, values, wall_ms())  # type: ignore[arg-type]
            self.metrics.reports.inc(len(values))
            return
        if rule.topic == "labels" and values:
            label = values[0]
            assert isinstance(label, OutcomeLabel)
            want = scope_partition(label.scope, self.partitions)
            if partition != want:
                # Keyed by request id, a label must be written to its scope's partition (where
                # the decision is held); elsewhere it would start a second controller.
                raise Rejected("wrong_partition", f"label of scope {label.scope!r} on "
                                                  f"partition {partition}, not {want}")
        authenticate(rule, values, None if self.keys is None else self.keys.check)

        def controller_for(key: str) -> ScopeController:
            return self.registry.get(key, partition).controller

        published = dispatch_all(rule, scope, values, controller_for, wall_ms())
        if rule.topic == "telemetry":
            self.metrics.reports.inc(len(values))
        elif rule.topic == "outcomes":
            self.metrics.decisions.inc(len(values))
            self.pending.flush()
        elif rule.topic == "labels":
            self.metrics.labels_received.inc(len(values))
            self.pending.flush()
        elif isinstance(values[0], OperatorOverride):
            self.metrics.observe_override(values[0])
            log.warning("operator override %s", describe(values[0]))
        if rule.durable:
            await self._save(scope)  # before publishing: an epoch on the wire is never reused
        for targets in published:
            await self._publish(targets)

    async def _ticks_agent(self, stream: faust.StreamT) -> None:
        async for event in stream.events():
            try:
                tick = msgspec.json.decode(event.value, type=Tick)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                self.metrics.ticks_skipped.labels("undecodable").inc()
                continue
            if wall_ms() - tick.ts_ms > 2 * self.tick_interval_ms:
                # Sent before a broker outage or a restart and delivered only now: acting on it
                # would publish targets already past due (a burst of stale epochs after every
                # outage). The next fresh tick, half a period away, does the work.
                self.metrics.ticks_skipped.labels("stale").inc()
                continue
            partition = event.message.partition
            await self._restored(partition)
            self.health.on_tick(partition, wall_ms())
            for scope in self.registry.scopes_on(partition):
                if self.second is not None:  # the gate says when a period closes
                    await self._close_periods(scope, partition, wall_ms())
                    continue
                entry = self.registry.get(scope, partition)
                if self.registry.due(entry, tick.ts_ms):
                    await self._tick_scope(scope, partition, tick.ts_ms)

    async def _tick_scope(self, scope: str, partition: int, now_ms: int) -> None:
        """Close the scope's period: its controller's tick, persisted, then published."""
        entry = self.registry.get(scope, partition)
        started = time.perf_counter()
        targets = entry.controller.tick(now_ms)
        self.metrics.tick_seconds.observe(time.perf_counter() - started)
        entry.last_tick_ms = now_ms
        await self._save(scope)  # before publishing: an epoch on the wire is never reused
        await self._publish(targets)
        self.metrics.observe_controller(scope, entry.controller)
        report = entry.controller.lift_report(now_ms)
        await self.estimates.send(key=scope.encode(), value=encode(report))

    async def _partials_agent(self, stream: faust.StreamT) -> None:
        """Second stage: hold each part in its scope's gate; close what it completes."""
        assert self.second is not None
        async for event in stream.events():
            message = event.message
            if self._restoring:
                await self._restored(message.partition)
            key = event.key.decode(errors="replace") if event.key else ""
            try:
                part = decode(WindowPartial, event.value)
                if key != part.region:
                    raise key_mismatch(key, part.region)
            except ContractError as exc:
                await self._dead_letter(message, exc.reason)
                continue
            except Rejected as exc:
                await self._dead_letter(message, str(exc), label=exc.reason)
                continue
            now_ms = wall_ms()
            self.second.add(part, now_ms)
            await self._close_periods(part.region, message.partition, now_ms)

    async def _close_periods(self, scope: str, partition: int, now_ms: int) -> None:
        """Second stage: the periods of ``scope`` its gate releases, merged and ticked."""
        assert self.second is not None
        released = self.second.release(scope, now_ms)
        if released is None:
            return
        controller = self.registry.get(scope, partition).controller
        for part in released.parts:
            try:
                controller.on_partial(part, now_ms)
            except REFUSALS as exc:  # a first stage of other laws (pools, accuracy)
                self.metrics.rejected.labels("partials", type(exc).__name__).inc()
                log.warning("part of shard %s for %s refused: %s", part.shard, scope, exc)
        await self._tick_scope(scope, partition, now_ms)

    async def _send_ticks(self) -> None:
        """Tick each partition this process owns; the owner of a scope is the only ticker."""
        self.health.on_beat(wall_ms())
        self.metrics.observe_lag(self.app.monitor)
        self.pending.checkpoint()
        name = self.ticks.get_topic_name()
        tick = msgspec.json.encode(Tick(wall_ms()))
        for tp in sorted(self.app.assignor.assigned_actives()):
            if tp.topic == name:
                await self.ticks.send(value=tick, partition=tp.partition)

    async def _publish(self, targets: ControlTargets) -> None:
        if self.keys is not None:
            targets = self.keys.sign(targets)
        delivery = await self.targets.send(key=targets.scope.encode(), value=encode(targets))
        self.metrics.observe_targets(targets)
        if isinstance(delivery, asyncio.Future):  # Faust's send returns the broker's answer
            delivery.add_done_callback(
                lambda done: self.metrics.observe_delivery(
                    targets, done.cancelled() or done.exception() is not None))

    async def _dead_letter(self, message: Any, reason: str, label: str | None = None) -> None:
        logical = self.names.get(message.topic, message.topic)
        self.metrics.rejected.labels(logical, (label or reason.split(" ")[0])[:40]).inc()
        letter = DeadLetter(
            ts_ms=wall_ms(), source_topic=message.topic, partition=message.partition,
            offset=message.offset, reason=reason[:2000],
            key_b64=base64.b64encode(message.key).decode() if message.key else None,
            value_b64=base64.b64encode(message.value or b"").decode())
        await self.deadletter.send(key=message.topic.encode(), value=encode(letter))
        log.warning("dead-lettered %s[%d]@%d: %s", message.topic, message.partition,
                    message.offset, reason)

    async def _save(self, scope: str) -> None:
        entry = self.registry.entries[scope]
        value = msgspec.json.encode(self.registry.save(scope))
        await self.changelog.send(key=scope.encode(), value=value, partition=entry.partition)

    async def _restored(self, partition: int) -> None:
        """Wait while the state of `partition` is being read back (only after a rebalance)."""
        pending = self._restoring.get(partition)
        if pending is not None:
            await pending.wait()

    async def _on_assigned(self, app: faust.App, assigned: set[Any], **_: Any) -> None:
        name = self.kafka.topic("telemetry")
        partitions = sorted({tp.partition for tp in assigned if tp.topic == name})
        fresh = [p for p in partitions if p not in self.registry.restored_partitions]
        for p in fresh:
            self._restoring[p] = asyncio.Event()
        self.health.on_assigned(partitions, fresh)
        try:
            await self.changelog.maybe_declare()  # nobody subscribes to it, so Faust won't
            topic = self.changelog.get_topic_name()
            stored = await self._until_read(f"state of partitions {fresh}", functools.partial(
                read_changelog, self.kafka, topic, fresh))
            for scope, reason in self.registry.restore(stored, fresh).items():
                self.metrics.restore_skipped.inc()
                log.error("state of scope %s not restored (starts afresh): %s", scope, reason)
            if fresh:
                await self.pending_topic.maybe_declare()
                started = time.monotonic()
                read = await self._until_read(f"pending decisions of partitions {fresh}",
                                              functools.partial(self.pending.restore, fresh))
                log.info("pending decisions of partitions %s: %d changelog entries read in "
                         "%.1f s", fresh, read, time.monotonic() - started)
        finally:
            for p in fresh:
                self._restoring.pop(p).set()
            if not self._restoring:
                self.health.on_restored()

    async def _until_read(self, what: str, read: Callable[[], T]) -> T:
        """Run the blocking ``read`` of stored state until it succeeds, however long the broker
        takes to answer; the partitions stay unready meanwhile, so no tick runs on a state not
        yet read. A failed read is never taken for empty state: a scope started afresh
        restarts its epoch at 1, every worker refuses targets below the epoch it holds, and
        none reach them until the count passes it again (`surplus chaos --seed 2`: a restart
        while a broker was down restarted the epochs from 1,162 and stopped the targets for
        483 s); pending decisions not read back become orphans. Both are safe to repeat: the
        state is read afresh each time, the pending decisions are written by key."""
        attempt = 0
        while True:
            try:
                return await asyncio.to_thread(read)
            except (KafkaException, TopicUnavailable) as exc:
                attempt += 1
                self.metrics.restore_retries.inc()
                log.error("%s not read (attempt %d, retrying): %s", what, attempt, exc)
                await asyncio.sleep(min(RESTORE_RETRY_MAX_S, 0.5 * attempt))

    async def _on_shutdown(self, app: faust.App, **_: Any) -> None:
        """Deliver the pending changelog's queued records before the process ends."""
        await asyncio.to_thread(self.pending.close)

    async def _on_revoked(self, app: faust.App, revoked: set[Any], **_: Any) -> None:
        self.health.on_revoked()
        partitions = sorted({tp.partition for tp in revoked})
        if self.first is not None and self.second is not None:
            self.first.forget(partitions)
            self.second.forget([scope for p in partitions
                                for scope in self.registry.scopes_on(p)])
        self.registry.forget(partitions)
