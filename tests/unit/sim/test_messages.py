"""Messages in flight inside a step (``sim.messages``): delivered by when they are due, then
in the order they were sent."""

from __future__ import annotations

from schemas.contract import ControlTargets, RmaTarget, SbmTarget
from sim.messages import MessageQueue, TargetsArrive


def _targets(epoch: int) -> TargetsArrive:
    return TargetsArrive(ControlTargets(
        scope="eu1", epoch=epoch, issued_at_ms=0, ttl_ms=1000,
        rma=RmaTarget(extra_candidates=0, budget_units_per_s=0.0), sbm=SbmTarget(coverage=0.0)))


def test_messages_come_by_when_they_are_due_then_in_the_order_sent() -> None:
    queue = MessageQueue()
    for at, epoch in ((20.0, 1), (10.0, 2), (20.0, 3), (10.0, 4)):
        queue.send(at, _targets(epoch))
    got = [(at, m.targets.epoch) for at, m in queue.due_before(100.0)]  # type: ignore[union-attr]
    assert got == [(10.0, 2), (10.0, 4), (20.0, 1), (20.0, 3)]


def test_only_messages_due_before_the_bound_are_delivered_and_the_rest_wait() -> None:
    queue = MessageQueue()
    queue.send(5.0, _targets(1))
    queue.send(10.0, _targets(2))
    assert [at for at, _ in queue.due_before(10.0)] == [5.0]
    assert [at for at, _ in queue.due_before(10.5)] == [10.0]
    assert list(queue.due_before(1e9)) == []


def test_a_message_sent_while_delivering_comes_in_the_same_pass_if_due() -> None:
    queue = MessageQueue()
    queue.send(1.0, _targets(1))
    seen = []
    for at, _message in queue.due_before(10.0):
        seen.append(at)
        if at == 1.0:
            queue.send(3.0, _targets(2))    # due inside the pass
            queue.send(30.0, _targets(3))   # not
    assert seen == [1.0, 3.0]
    assert [at for at, _ in queue.due_before(31.0)] == [30.0]
