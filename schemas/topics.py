"""The topic catalog: logical topics of DESIGN.md with their key, value type and settings.

Names on a cluster are `prefix + logical name`, so several deployments (or test runs) can share
one cluster. `surplus topics apply` creates what is missing and reports what disagrees.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.contract import (
    CapacityEvent,
    ControlTargets,
    DeadLetter,
    Event,
    LiftReport,
    OperatorOverride,
    OutcomeLabel,
    PreemptionNotice,
    ReplicaAnnouncement,
    RoutingOutcome,
    WindowReport,
)
from schemas.precompute import PrecomputeJob, PrecomputeResult

DEFAULT_PREFIX = "surplus."
HOUR_MS = 3_600_000
# Every input topic is keyed by scope (the region) and has the same partition count, so all
# events of one scope land in the same partition number everywhere: the control-plane process
# that owns that partition owns the scope, with no repartition hop. Producers must use the
# Java-compatible murmur2 partitioner (`KafkaSettings.producer()`), as Faust/aiokafka does.
SCOPE_PARTITIONS = 8
#: Replicas per partition where the cluster has the brokers: with three, losing any one broker
#: loses no message acknowledged to acks=all and leaves every partition writable.
MAX_REPLICATION = 3


@dataclass(frozen=True)
class TopicSpec:
    """One logical topic: what its key means, what its values are, and how it is kept."""

    logical: str
    key: str
    value_type: type[Event]
    partitions: int
    cleanup_policy: str
    retention_ms: int

    def name(self, prefix: str = DEFAULT_PREFIX) -> str:
        return f"{prefix}{self.logical}"

    def config(self) -> dict[str, str]:
        """Topic-level configs to set on creation (and to compare against)."""
        config = {"cleanup.policy": self.cleanup_policy, "retention.ms": str(self.retention_ms)}
        if self.cleanup_policy == "compact":
            # Compact soon so a restarted reader sees one value per scope, not a long history.
            config.update({"min.cleanable.dirty.ratio": "0.1", "segment.ms": "600000",
                           "retention.ms": "-1"})
        return config


CATALOG: tuple[TopicSpec, ...] = (
    TopicSpec("telemetry", "scope", WindowReport, SCOPE_PARTITIONS, "delete", 6 * HOUR_MS),
    TopicSpec("capacity", "scope", CapacityEvent, SCOPE_PARTITIONS, "delete", 7 * 24 * HOUR_MS),
    TopicSpec("preemption", "scope", PreemptionNotice, SCOPE_PARTITIONS, "delete",
              7 * 24 * HOUR_MS),
    TopicSpec("targets", "scope", ControlTargets, SCOPE_PARTITIONS, "compact", -1),
    TopicSpec("outcomes", "scope", RoutingOutcome, SCOPE_PARTITIONS, "delete", 24 * HOUR_MS),
    # Outcomes of requests, arriving late: keyed by request id, each written to the partition
    # of its scope (`scope_partition`) so it reaches the process that holds the decision.
    TopicSpec("labels", "request id", OutcomeLabel, SCOPE_PARTITIONS, "delete", 24 * HOUR_MS),
    # What optional work measurably paid, per scope and period: the control plane's output.
    TopicSpec("estimates", "scope", LiftReport, SCOPE_PARTITIONS, "compact", -1),
    TopicSpec("overrides", "scope", OperatorOverride, SCOPE_PARTITIONS, "compact", -1),
    # Membership: one value per replica id (a tombstone when it stops); every client reads all
    # of it, so one partition keeps the whole live set in one ordered log.
    TopicSpec("replicas", "replica id", ReplicaAnnouncement, 1, "compact", -1),
    # The precompute lever: jobs spread by their key over every partition, taken by the
    # opportunistic replicas of one model in a consumer group; answers kept, one per key.
    TopicSpec("precompute", "job key", PrecomputeJob, SCOPE_PARTITIONS, "delete", HOUR_MS),
    TopicSpec("cache", "job key", PrecomputeResult, SCOPE_PARTITIONS, "compact", -1),
    TopicSpec("deadletter", "source topic", DeadLetter, 1, "delete", 14 * 24 * HOUR_MS),
)

BY_LOGICAL: dict[str, TopicSpec] = {spec.logical: spec for spec in CATALOG}


def spec(logical: str) -> TopicSpec:
    """The spec of a logical topic; the error lists the valid names."""
    try:
        return BY_LOGICAL[logical]
    except KeyError:
        raise KeyError(f"unknown topic {logical!r}; known: {', '.join(BY_LOGICAL)}") from None


def topic_name(logical: str, prefix: str = DEFAULT_PREFIX) -> str:
    return spec(logical).name(prefix)


def replication_for(brokers: int) -> int:
    """The replication factor of Surplus's topics on a cluster of ``brokers``: every broker,
    up to `MAX_REPLICATION` (more copies cost writes and buy nothing one lost broker needs)."""
    if brokers < 1:
        raise ValueError(f"a cluster has at least one broker, not {brokers}")
    return min(MAX_REPLICATION, brokers)


def min_insync_for(replication: int) -> int:
    """Replicas that must hold a write before acks=all acknowledges it: all but one, so one
    broker may be lost without losing an acknowledged write or the partition's writability."""
    return max(1, replication - 1)


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (the Java client's ``Utils.murmur2``), as a 32-bit unsigned int."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = length & ~3
    extra = length % 4
    if extra >= 3:
        h ^= data[tail + 2] << 16
    if extra >= 2:
        h ^= data[tail + 1] << 8
    if extra >= 1:
        h ^= data[tail]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def scope_partition(scope: str, partitions: int = SCOPE_PARTITIONS) -> int:
    """The partition a key of ``scope`` lands on under the Java-compatible murmur2
    partitioner: where a label of that scope must be written, whatever its key."""
    return (murmur2(scope.encode()) & 0x7FFFFFFF) % partitions
