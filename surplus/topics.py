"""`surplus topics apply`: create the catalog's topics, idempotently, and report disagreements."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from schemas import kafka_clients
from schemas.kafka_clients import AdminClient, ConfigResource, NewTopic
from schemas.topics import CATALOG, DEFAULT_PREFIX, min_insync_for, replication_for


@dataclass
class ApplyReport:
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    #: Replicas per partition of the topics created (from the cluster's broker count).
    replication_factor: int = 1

    @property
    def ok(self) -> bool:
        return not self.mismatches


def create_topics(admin: AdminClient, topics: list[NewTopic], timeout_s: float) -> list[str]:
    """Create ``topics``; the names created (one that already exists is not an error, as
    another process may have just made it). Any other failure raises. Returns once every
    topic is in the brokers' metadata with a leader for each partition (`await_visible`)."""
    if not topics:
        return []
    created = []
    for name, future in admin.create_topics(topics, request_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
            created.append(name)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    await_visible(admin, [t.topic for t in topics], timeout_s)
    return created


def await_visible(admin: AdminClient, names: list[str], timeout_s: float) -> None:
    """Wait until every topic of ``names`` has a leader for each partition in the metadata the
    brokers serve. The controller acknowledges a creation before the brokers have applied it:
    a client that asks at once (a consumer assigning partitions) is told the topic does not
    exist, as a loaded machine showed. Raises TimeoutError naming the topics still missing."""
    deadline = time.monotonic() + timeout_s
    missing = list(names)
    while missing:
        meta = admin.list_topics(timeout=max(0.1, deadline - time.monotonic())).topics
        missing = [n for n in missing if n not in meta or meta[n].error is not None
                   or not meta[n].partitions
                   or any(p.leader < 0 for p in meta[n].partitions.values())]
        if missing and time.monotonic() >= deadline:
            raise TimeoutError(f"topics created but not served after {timeout_s:.0f} s: "
                               f"{', '.join(missing)}")
        if missing:
            time.sleep(0.05)


def cluster_replication(admin: AdminClient, timeout_s: float) -> int:
    """The replication factor for new topics on the cluster `admin` talks to: its broker
    count, up to three (`schemas.topics.replication_for`)."""
    return replication_for(len(admin.list_topics(timeout=timeout_s).brokers))


def replicated(config: dict[str, str], replication: int) -> dict[str, str]:
    """A topic's config with the min.insync.replicas its replication factor needs, so that a
    write acknowledged to acks=all survives a broker lost, whatever the cluster's default."""
    min_insync = min_insync_for(replication)
    return {**config, "min.insync.replicas": str(min_insync)} if min_insync > 1 else config


def apply_topics(client_config: dict[str, Any], prefix: str = DEFAULT_PREFIX,
                 partitions_override: int | None = None, timeout_s: float = 30.0,
                 replication_factor: int | None = None) -> ApplyReport:
    """Create missing topics (replicated per `cluster_replication` unless told); compare
    partitions and cleanup.policy of the ones that exist."""
    admin = kafka_clients.admin(client_config)
    meta = admin.list_topics(timeout=timeout_s)
    replication = replication_factor or replication_for(len(meta.brokers))
    report = ApplyReport(replication_factor=replication)
    to_create = []
    for spec in CATALOG:
        name = spec.name(prefix)
        partitions = partitions_override or spec.partitions
        if name in meta.topics:
            report.existing.append(name)
            have = len(meta.topics[name].partitions)
            if have != partitions:
                report.mismatches.append(f"{name}: {have} partitions, catalog says {partitions}")
            continue
        to_create.append(NewTopic(name, num_partitions=partitions,
                                  replication_factor=replication,
                                  config=replicated(spec.config(), replication)))
    created = create_topics(admin, to_create, timeout_s)
    report.created.extend(created)
    report.existing.extend(t.topic for t in to_create if t.topic not in created)
    report.mismatches.extend(_policy_mismatches(admin, prefix, report.existing, timeout_s))
    return report


def _policy_mismatches(admin: AdminClient, prefix: str, names: list[str],
                       timeout_s: float) -> list[str]:
    if not names:
        return []
    wanted = {spec.name(prefix): spec.cleanup_policy for spec in CATALOG}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in names]
    problems = []
    for resource, future in admin.describe_configs(resources).items():
        configs = future.result(timeout=timeout_s)
        have = configs["cleanup.policy"].value
        if have != wanted[resource.name]:
            problems.append(f"{resource.name}: cleanup.policy={have}, "
                            f"catalog says {wanted[resource.name]}")
    return problems
