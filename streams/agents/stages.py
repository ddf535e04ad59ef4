"""The two stages of a scaled-out control plane, wired to Faust (``stages = 2``).

With ``stages = 2`` workers key their reports by replica, so a region's telemetry spreads over
every partition and every process of the group reads some of it. ``FirstStage`` keeps one
``ShardWindows`` per telemetry partition this process owns, named by the partition, so the
process that takes a partition over after a rebalance speaks for it under the same name, and
sends each scope's parts to the plane's own partials topic, keyed by scope. That topic is
partitioned like the inputs, so a scope's parts reach the process that owns the scope, whose
``SecondStage`` holds them in a ``PeriodGate`` and closes the period when they are all there
or its grace runs out. The rules are the pure ones of ``streams.control.shards`` and
``streams.control.gate``, which offline replay runs too (``surplus replay --shards K``).

What a restart or a rebalance loses: a first stage's open period of a moved partition (its
reports are already committed; the period closes without them, by grace), and the parts a
second stage held for an unclosed period. Each is at most one period of a scope's telemetry,
what one reader loses of its open window when it restarts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from schemas.codec import encode
from schemas.contract import WindowPartial, WindowReport
from streams.agents.metrics import Metrics
from streams.control.config import ControlConfig
from streams.control.gate import PeriodGate, Release
from streams.control.shards import ShardWindows

Send = Callable[[WindowPartial], Awaitable[Any]]


class FirstStage:
    """This process's telemetry partitions, summed per scope and period, and sent on."""

    def __init__(self, config: ControlConfig, send: Send, metrics: Metrics) -> None:
        self._config = config
        self._send = send
        self._metrics = metrics
        self._shards: dict[int, ShardWindows] = {}

    def take(self, partition: int, key: str | None, reports: Sequence[WindowReport],
             now_ms: int) -> None:
        """One telemetry message read from ``partition`` (``Rejected`` if refused)."""
        shard = self._shards.get(partition)
        if shard is None:
            config = self._config
            shard = self._shards[partition] = ShardWindows(
                str(partition), lambda scope: config.for_scope(scope).period_ms,
                min_samples=config.min_samples, relative_accuracy=config.relative_accuracy,
                max_pools=config.max_pools)
        shard.take(key, reports, now_ms)

    async def flush(self, now_ms: int) -> None:
        """Send the parts of every period that has ended (empty ones included)."""
        for partition in sorted(self._shards):
            shard = self._shards[partition]
            for part in shard.due(now_ms):
                await self._send(part)
                self._metrics.parts_sent.labels(shard.shard).inc()

    def forget(self, partitions: Sequence[int]) -> None:
        """Partitions revoked: their new owner speaks for them from its next period."""
        for partition in partitions:
            self._shards.pop(partition, None)


class SecondStage:
    """The gates of the scopes this process owns: which periods can close, and when."""

    def __init__(self, config: ControlConfig, grace_ms: int, metrics: Metrics) -> None:
        self._config = config
        self._grace_ms = grace_ms
        self._metrics = metrics
        self._gates: dict[str, PeriodGate] = {}

    def gate(self, scope: str, now_ms: int) -> PeriodGate:
        gate = self._gates.get(scope)
        if gate is None:
            gate = self._gates[scope] = PeriodGate(self._config.for_scope(scope).period_ms,
                                                   self._grace_ms, start_ms=now_ms)
        return gate

    def add(self, part: WindowPartial, now_ms: int) -> None:
        gate = self.gate(part.region, now_ms)
        late = gate.late
        gate.add(part)
        if gate.late > late:
            self._metrics.parts_late.labels(part.region).inc()

    def release(self, scope: str, now_ms: int) -> Release | None:
        """The periods of ``scope`` that can close now (None: none), counted by how."""
        released = self.gate(scope, now_ms).release(now_ms)
        if released is not None:
            how = "grace" if released.missing else "complete"
            self._metrics.periods_closed.labels(scope, how).inc()
            if released.missing:
                self._metrics.shards_missing.labels(scope).inc(len(released.missing))
        return released

    def forget(self, scopes: Sequence[str]) -> None:
        for scope in scopes:
            self._gates.pop(scope, None)


def encode_part(part: WindowPartial) -> tuple[bytes, bytes]:
    """The key (its scope) and value of a part on the partials topic."""
    return part.region.encode(), encode(part)
