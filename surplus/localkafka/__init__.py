"""The embedded local Kafka broker: a real Apache Kafka (KRaft) from Maven jars.

Docker is not everywhere; Java and Maven Central are. `surplus kafka up` runs the same broker
that production uses, on 127.0.0.1, so tests, the demo and a new user's first try all talk to
real Kafka. Every failure mode ends in `BrokerError` with a one-line reason, never a hang.

One node by default. `up_cluster` runs several (`surplus kafka up --brokers 3`), each broker
and KRaft controller, replicated as production is (`schemas.topics.replication_for`), so that a
broker can be killed under load: node *i* (from 1) listens on ``port + 2(i-1)`` and its
controller on the port after, and keeps its state in ``data_dir/node-i`` laid out as a
single broker's data dir.

The package is split by concern: `jvm` (a broker JVM and its files), `ports`, `listeners`
(secured, or behind a proxy), `broker` (one node) and `cluster` (several); every public name
is importable from here.
"""

from __future__ import annotations

from surplus.localkafka.broker import BrokerInfo, brokers_seen, down, serves_metadata, status, up
from surplus.localkafka.cluster import (
    CLUSTER_HEAP_MB,
    CLUSTER_START_TIMEOUT_S,
    MAX_BROKERS,
    ClusterInfo,
    cluster_status,
    down_cluster,
    is_cluster,
    up_cluster,
)
from surplus.localkafka.jvm import (
    BROKER_GC,
    DEFAULT_DATA,
    DEFAULT_LIBS,
    DEFAULT_PORT,
    GC_LOG,
    INFRA_DIR,
    REPO_ROOT,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    BrokerError,
    fetch_jars,
    gc_pauses,
    java_binary,
    kafka_version,
    libs_dir,
    rss_mb,
)
from surplus.localkafka.listeners import BehindProxy, SecuredListeners
from surplus.localkafka.ports import PRIVATE_PORT_LOW, free_port, free_port_block, free_ports

__all__ = [
    "BROKER_GC", "CLUSTER_HEAP_MB", "CLUSTER_START_TIMEOUT_S", "DEFAULT_DATA", "DEFAULT_LIBS",
    "DEFAULT_PORT", "GC_LOG", "INFRA_DIR", "MAX_BROKERS", "PRIVATE_PORT_LOW", "REPO_ROOT",
    "START_TIMEOUT_S", "STOP_TIMEOUT_S", "BehindProxy", "BrokerError", "BrokerInfo",
    "ClusterInfo", "SecuredListeners", "brokers_seen", "cluster_status", "down",
    "down_cluster", "fetch_jars", "free_port", "free_port_block", "free_ports", "gc_pauses",
    "is_cluster",
    "java_binary", "kafka_version", "libs_dir", "rss_mb", "serves_metadata", "status", "up",
    "up_cluster",
]
