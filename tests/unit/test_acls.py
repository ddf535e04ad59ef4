"""The ACL table: the docs' Security page shows exactly what the secured-cluster test grants,
and it is least privilege (only the control plane writes targets; no component reads what it
does not use)."""

from __future__ import annotations

from pathlib import Path

import pytest

from surplus import acls

SECURITY = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def _grants(component: acls.Component, op: str) -> set[str]:
    return {r.name for r in acls.required_acls(component) if op in r.operations}


def test_the_docs_show_the_table_the_secured_cluster_test_grants() -> None:
    assert acls.markdown_table() in SECURITY.read_text()


def test_only_the_control_plane_may_write_targets() -> None:
    writers = {c for c in acls.COMPONENTS if "surplus.targets" in _grants(c, "WRITE")}
    assert writers == {"control-plane"}


def test_receivers_read_only_what_they_follow() -> None:
    assert _grants("worker", "READ") == {"surplus.targets", "surplus.preemption",
                                         "surplus.precompute",
                                         "surplus.precompute."}  # and its group (prefixed)
    assert _grants("client", "READ") == {"surplus.targets", "surplus.replicas",
                                         "surplus.cache"}
    assert _grants("scheduler", "READ") == {"surplus.replicas"}  # where to post notices


def test_names_follow_prefix_and_app_id() -> None:
    rules = acls.required_acls("control-plane", prefix="prod.", app_id="cp-eu")
    names = {(r.resource, r.name, r.pattern) for r in rules}
    assert ("topic", "prod.telemetry", "literal") in names
    assert ("topic", "prod.cp-eu-", "prefixed") in names
    assert ("group", "cp-eu", "literal") in names


def test_bindings_cover_every_operation_and_refuse_unknown_components() -> None:
    bindings = acls.bindings("worker", "User:worker")
    assert len(bindings) == sum(len(r.operations) for r in acls.required_acls("worker"))
    with pytest.raises(ValueError, match="unknown component"):
        acls.required_acls("intruder")  # type: ignore[arg-type]


def test_a_capacity_agent_may_only_lend_its_replica_and_send_its_notices() -> None:
    assert _grants("capacity-agent", "WRITE") == {"surplus.capacity", "surplus.preemption"}
    assert _grants("capacity-agent", "READ") == set()


def test_only_workers_announce_membership() -> None:
    writers = {c for c in acls.COMPONENTS if "surplus.replicas" in _grants(c, "WRITE")}
    assert writers == {"worker"}


def test_only_workers_answer_precompute_jobs_and_only_clients_ask_for_them() -> None:
    assert {c for c in acls.COMPONENTS if "surplus.cache" in _grants(c, "WRITE")} == {"worker"}
    assert ({c for c in acls.COMPONENTS if "surplus.precompute" in _grants(c, "WRITE")}
            == {"client"})
