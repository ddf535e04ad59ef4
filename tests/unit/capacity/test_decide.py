"""The capacity agent's decisions: metadata documents and hook calls -> PreemptionNotices."""

from __future__ import annotations

import pytest

from workers.capacity.decide import (
    InstanceAction,
    MetadataError,
    NoticeDecider,
    Rebalance,
    Replica,
    parse_instance_action,
    parse_rebalance,
    rfc3339_ms,
)

REPLICA = Replica(worker_id="eu1-rank-7", pool_id="eu1/rank/baseline/a100/opportunistic",
                  accelerator_units=2.0, cpu_units=8.0)
NOW = 1_764_590_400_000  # 2025-12-01T12:00:00Z


def test_rfc3339_times_become_epoch_milliseconds() -> None:
    assert rfc3339_ms("2025-12-01T12:00:00Z") == NOW
    assert rfc3339_ms("2025-12-01T13:00:00+01:00") == NOW
    assert rfc3339_ms("2025-12-01T12:00:00.250Z") == NOW + 250
    assert rfc3339_ms("1970-01-01T00:00:00Z") == 0
    assert rfc3339_ms("2024-02-29T00:00:00Z") == 1_709_164_800_000


@pytest.mark.parametrize("text", ["2025-12-01 12:00", "2025-02-30T00:00:00Z", "soon", "",
                                  "2025-12-01T25:00:00Z"])
def test_a_time_that_is_not_rfc3339_is_refused_naming_it(text: str) -> None:
    with pytest.raises(MetadataError, match="time"):
        rfc3339_ms(text)


def test_an_interruption_notice_has_the_instance_action_time_as_deadline() -> None:
    action = parse_instance_action(b'{"action": "terminate", "time": "2025-12-01T12:02:00Z"}')
    assert action == InstanceAction("terminate", NOW + 120_000)
    notice = NoticeDecider(REPLICA).on_instance_action(action, NOW)
    assert notice is not None
    assert (notice.deadline_ms, notice.ts_ms, notice.replicas) == (NOW + 120_000, NOW,
                                                                    ["eu1-rank-7"])
    assert (notice.region, notice.pool_id, notice.accelerator) == (
        "eu1", "eu1/rank/baseline/a100/opportunistic", "a100")
    assert (notice.accelerator_units, notice.cpu_units) == (2.0, 8.0)


def test_polling_the_same_interruption_again_sends_nothing_more() -> None:
    decider = NoticeDecider(REPLICA)
    action = InstanceAction("stop", NOW + 120_000)
    assert decider.on_instance_action(action, NOW) is not None
    assert decider.on_instance_action(action, NOW + 2_000) is None
    # the metadata service's time may drift later between polls: still the same reclaim
    assert decider.on_instance_action(InstanceAction("stop", NOW + 122_000), NOW + 2_000) is None
    assert len(decider.sent) == 1


def test_an_interruption_already_past_its_time_still_gives_a_notice() -> None:
    notice = NoticeDecider(REPLICA).on_instance_action(InstanceAction("terminate", NOW - 5_000),
                                                       NOW)
    assert notice is not None and notice.deadline_ms == NOW - 5_000


def test_a_rebalance_recommendation_is_only_counted_by_default() -> None:
    decider = NoticeDecider(REPLICA)
    assert decider.on_rebalance(parse_rebalance(b'{"noticeTime": "2025-12-01T12:00:00Z"}'),
                                NOW) is None
    assert decider.rebalances_seen == 1 and decider.sent == []


def test_a_rebalance_as_notice_then_an_interruption_that_comes_sooner() -> None:
    decider = NoticeDecider(REPLICA, on_rebalance="notice", rebalance_deadline_s=300)
    first = decider.on_rebalance(Rebalance(NOW), NOW)
    assert first is not None and first.deadline_ms == NOW + 300_000
    assert decider.on_rebalance(Rebalance(NOW + 5_000), NOW + 5_000) is None
    sooner = decider.on_instance_action(InstanceAction("terminate", NOW + 130_000), NOW + 10_000)
    assert sooner is not None and sooner.deadline_ms == NOW + 130_000
    assert sooner.notice_id != first.notice_id  # the worker applies it, not a duplicate


def test_a_termination_hook_gives_the_grace_period_as_notice() -> None:
    decider = NoticeDecider(REPLICA)
    notice = decider.on_termination(30.0, NOW, why="prestop")
    assert notice is not None and notice.deadline_ms == NOW + 30_000
    assert notice.notice_id.startswith("k8s-prestop-")
    # SIGTERM after the preStop call: the same end, nothing new to say
    assert decider.on_termination(30.0, NOW + 1_000, why="sigterm") is None


@pytest.mark.parametrize(("body", "named"), [
    (b"<html>404 - Not Found</html>", "not the expected JSON"),
    (b'{"action": "terminate"}', "time"),
    (b'{"action": "explode", "time": "2025-12-01T12:02:00Z"}', "action 'explode'"),
    (b'{"action": "terminate", "time": "in two minutes"}', "not RFC 3339"),
    (b'{"action": 3, "time": "2025-12-01T12:02:00Z"}', "str"),
])
def test_a_bad_instance_action_document_is_refused_saying_what_is_wrong(
        body: bytes, named: str) -> None:
    with pytest.raises(MetadataError, match=named):
        parse_instance_action(body)


def test_a_bad_rebalance_document_is_refused() -> None:
    with pytest.raises(MetadataError, match="rebalance"):
        parse_rebalance(b'{"notice": "2025-12-01T12:00:00Z"}')


@pytest.mark.parametrize("pool", ["eu1/rank", "eu1//baseline/a100/opportunistic", ""])
def test_a_replica_needs_a_whole_pool_id(pool: str) -> None:
    with pytest.raises(ValueError, match="pool id"):
        Replica(worker_id="w", pool_id=pool)
