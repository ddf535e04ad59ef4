"""The topic ACLs each Surplus component needs on a cluster that enforces them (least privilege).

One table, used three ways: docs/security.md's ACL table is generated from it
(`markdown_table`), the secured-cluster integration test grants exactly these ACLs before running
the control plane and a worker (so the documented set is known to be enough), and an operator can
turn it into bindings for their own principals (`bindings`).

Names are the deployment's: ``prefix`` is the topic prefix (``SURPLUS_KAFKA_PREFIX``) and
``app_id`` the control plane's consumer group (``--app-id``); Faust names its internal topics
``{prefix}{app_id}-...``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from schemas.precompute import PRECOMPUTE_GROUPS
from schemas.topics import DEFAULT_PREFIX

Component = Literal["control-plane", "worker", "client", "scheduler", "capacity-agent",
                    "operator"]
COMPONENTS: tuple[Component, ...] = ("control-plane", "worker", "client", "scheduler",
                                     "capacity-agent", "operator")
DEFAULT_APP_ID = "surplus-control"
#: Group-id prefixes of the worker's and the client's consumers (workers.runtime.kafka_io,
#: workers.client.feed). They assign partitions by hand and commit nothing, but librdkafka still
#: looks up their group coordinator, which takes DESCRIBE on the group.
WORKER_GROUPS = "surplus-worker."
CLIENT_GROUPS = "surplus-client-"


@dataclass(frozen=True)
class AclRule:
    """Allow ``operations`` on one resource (a literal name or every name with a prefix)."""

    resource: Literal["topic", "group"]
    name: str
    pattern: Literal["literal", "prefixed"]
    operations: tuple[str, ...]
    why: str


def _topic(prefix: str, logical: str, ops: tuple[str, ...], why: str) -> AclRule:
    return AclRule("topic", f"{prefix}{logical}", "literal", ops, why)


READ = ("READ", "DESCRIBE")
WRITE = ("WRITE", "DESCRIBE")


def required_acls(component: Component, prefix: str = DEFAULT_PREFIX,
                  app_id: str = DEFAULT_APP_ID) -> list[AclRule]:
    """What `component` must be allowed to do; nothing else is needed."""
    if component == "control-plane":
        inputs = [_topic(prefix, t, READ, "input, co-partitioned by scope")
                  for t in ("telemetry", "capacity", "preemption", "outcomes", "labels",
                            "overrides")]
        return [*inputs,
                _topic(prefix, "targets", WRITE, "publishes ControlTargets"),
                _topic(prefix, "estimates", WRITE, "publishes measured lift (LiftReport)"),
                _topic(prefix, "deadletter", WRITE, "rejected input"),
                AclRule("topic", f"{prefix}{app_id}-", "prefixed",
                        ("CREATE", "READ", "WRITE", "DESCRIBE"),
                        "its own tick, state and pending-decision changelog topics "
                        "(created at start)"),
                AclRule("group", app_id, "literal", ("READ", "DESCRIBE"),
                        "the Faust consumer group (partition ownership, commits)"),
                AclRule("group", f"{prefix}{app_id}-", "prefixed", ("DESCRIBE",),
                        "state read-back consumer (assigned by hand, commits nothing)")]
    if component == "worker":
        return [_topic(prefix, "targets", READ, "follows targets (manual assignment)"),
                _topic(prefix, "preemption", ("READ", "WRITE", "DESCRIBE"),
                       "preemption fast path (offsets by time); its own notice on SIGTERM"),
                _topic(prefix, "telemetry", WRITE, "WindowReports"),
                _topic(prefix, "replicas", WRITE, "its membership: serving, draining, tombstone"),
                _topic(prefix, "deadletter", WRITE, "undecodable targets or notices"),
                AclRule("group", WORKER_GROUPS, "prefixed", ("DESCRIBE",),
                        "its consumers' group ids (assigned by hand, commit nothing)"),
                _topic(prefix, "precompute", READ,
                       "precompute jobs, on a lent replica with the lever on"),
                _topic(prefix, "cache", WRITE, "precompute answers (PrecomputeResult)"),
                AclRule("group", f"{prefix}{PRECOMPUTE_GROUPS}", "prefixed",
                        ("READ", "DESCRIBE"),
                        "the precompute group of its region and model (commits answered jobs)")]
    if component == "client":
        return [_topic(prefix, "targets", READ, "follows targets (manual assignment)"),
                _topic(prefix, "replicas", READ, "routes to the live set (manual assignment)"),
                _topic(prefix, "outcomes", WRITE, "decision records (batched)"),
                _topic(prefix, "labels", WRITE, "outcome labels, when it knows them"),
                _topic(prefix, "deadletter", WRITE, "undecodable targets"),
                _topic(prefix, "precompute", WRITE, "precompute jobs for users likely to come"),
                _topic(prefix, "cache", READ, "precompute answers, read at request time"),
                AclRule("group", CLIENT_GROUPS, "prefixed", ("DESCRIBE",),
                        "its targets feed's group id (assigned by hand, commits nothing)")]
    if component == "scheduler":
        return [_topic(prefix, "capacity", WRITE, "grants and revokes"),
                _topic(prefix, "preemption", WRITE, "PreemptionNotices"),
                _topic(prefix, "replicas", READ,
                       "where reclaimed replicas listen: each notice is posted to them too"),
                AclRule("group", CLIENT_GROUPS, "prefixed", ("DESCRIBE",),
                        "its replicas feed's group id (assigned by hand, commits nothing)")]
    if component == "capacity-agent":
        return [_topic(prefix, "capacity", WRITE,
                       "its replica's own grants, renewals and revokes"),
                _topic(prefix, "preemption", WRITE,
                       "its replica's PreemptionNotices (spot interruption, preStop)")]
    if component == "operator":
        return [AclRule("topic", prefix, "prefixed",
                        ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"),
                        "`surplus topics apply` creates and checks the catalog"),
                _topic(prefix, "overrides", ("READ", "WRITE", "DESCRIBE"),
                       "`surplus override` set, clear, list: the kill switch and caps")]
    raise ValueError(f"unknown component {component!r}; known: {', '.join(COMPONENTS)}")


def bindings(component: Component, principal: str, prefix: str = DEFAULT_PREFIX,
             app_id: str = DEFAULT_APP_ID) -> list[object]:
    """confluent-kafka `AclBinding`s (ALLOW, any host) granting `principal` what it needs."""
    from schemas.kafka_clients import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    out: list[object] = []
    for rule in required_acls(component, prefix, app_id):
        for op in rule.operations:
            out.append(AclBinding(ResourceType[rule.resource.upper()], rule.name,
                                  ResourcePatternType[rule.pattern.upper()], principal, "*",
                                  AclOperation[op], AclPermissionType.ALLOW))
    return out


def markdown_table(prefix: str = DEFAULT_PREFIX, app_id: str = DEFAULT_APP_ID) -> str:
    """The ACL table in docs/security.md."""
    lines = ["| component | resource | operations | why |", "|---|---|---|---|"]
    for component in COMPONENTS:
        for rule in required_acls(component, prefix, app_id):
            star = "*" if rule.pattern == "prefixed" else ""
            lines.append(f"| {component} | {rule.resource} `{rule.name}{star}` | "
                         f"{', '.join(rule.operations)} | {rule.why} |")
    return "\n".join(lines)
