"""`surplus topics apply`: create the catalog's topics, idempotently, and report disagreements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas import kafka_clients
from schemas.kafka_clients import AdminClient, ConfigResource, NewTopic
from schemas.topics import CATALOG, DEFAULT_PREFIX


@dataclass
class ApplyReport:
    created: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def create_topics(admin: AdminClient, topics: list[NewTopic], timeout_s: float) -> list[str]:
    """Create ``topics``; the names created (one that already exists is not an error, as
    another process may have just made it). Any other failure raises."""
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
    return created


def apply_topics(client_config: dict[str, Any], prefix: str = DEFAULT_PREFIX,
                 partitions_override: int | None = None, timeout_s: float = 30.0) -> ApplyReport:
    """Create missing topics; compare partitions and cleanup.policy of the ones that exist."""
    admin = kafka_clients.admin(client_config)
    meta = admin.list_topics(timeout=timeout_s)
    report = ApplyReport()
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
        to_create.append(NewTopic(name, num_partitions=partitions, replication_factor=-1,
                                  config=spec.config()))
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
