"""The capacity agent's loop around its decisions: bad or missing metadata is a log line and no
notice, and polling goes on; a notice the broker did not take is sent again, never dropped. An
opportunistic replica's share is granted once its worker is ready and renewed; its notice goes
out first and its revoke after, and nothing is granted once it is reclaimed."""

from __future__ import annotations

import logging

import pytest

from schemas.contract import CapacityEvent, PreemptionNotice
from workers.capacity.agent import INSTANCE_ACTION, REBALANCE, CapacityAgent
from workers.capacity.decide import NoticeDecider, Replica
from workers.capacity.imds import ImdsError
from workers.capacity.lend import Lender, WorkerProbe
from workers.capacity.platform import Identity, Share

REPLICA = Replica(worker_id="w1", pool_id="eu1/rank/baseline/a100/opportunistic")
NOW = 1_764_590_400_000
GOOD = b'{"action": "terminate", "time": "2025-12-01T12:02:00Z"}'


class FakeImds:
    """Answers each path from a script: bytes, None (404) or an ImdsError to raise."""

    def __init__(self, answers: dict[str, list[bytes | Exception | None]]) -> None:
        self.answers = answers

    def get(self, path: str) -> bytes | None:
        answer = self.answers[path].pop(0) if len(self.answers[path]) > 1 else \
            self.answers[path][0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _agent(imds: FakeImds, send: list[bool]) -> tuple[CapacityAgent, list[PreemptionNotice]]:
    out: list[PreemptionNotice] = []

    def sender(notice: PreemptionNotice) -> bool:
        ok = send.pop(0) if send else True
        if ok:
            out.append(notice)
        return ok

    return CapacityAgent(NoticeDecider(REPLICA), sender, imds=imds,  # type: ignore[arg-type]
                         clock=lambda: NOW), out


def test_bad_then_good_metadata_logs_once_sends_nothing_then_the_notice(
        caplog: pytest.LogCaptureFixture) -> None:
    imds = FakeImds({INSTANCE_ACTION: [b"<html>oops</html>", b"<html>oops</html>", GOOD],
                     REBALANCE: [None]})
    agent, sent = _agent(imds, [])
    with caplog.at_level(logging.WARNING):
        assert agent.poll_aws() == [] and agent.poll_aws() == []
        bad = [r for r in caplog.records if "not the expected JSON" in r.getMessage()]
        assert len(bad) == 1  # once per change, not once per poll
        assert "spot/instance-action" in bad[0].getMessage()
        assert [n.deadline_ms for n in agent.poll_aws()] == [NOW + 120_000]
    assert "reads again" in caplog.text and len(sent) == 1


def test_an_unreachable_service_is_no_notice_and_polling_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    down = ImdsError("metadata service at http://169.254.169.254 unreachable: timed out")
    imds = FakeImds({INSTANCE_ACTION: [down, GOOD], REBALANCE: [None]})
    agent, sent = _agent(imds, [])
    with caplog.at_level(logging.WARNING):
        assert agent.poll_aws() == []
        assert "unreachable" in caplog.text
        assert len(agent.poll_aws()) == 1 and len(sent) == 1


def test_a_notice_kafka_did_not_take_is_sent_at_the_next_poll() -> None:
    imds = FakeImds({INSTANCE_ACTION: [GOOD], REBALANCE: [None]})
    agent, sent = _agent(imds, [False])
    assert agent.poll_aws() == [] and agent.unsent
    assert [n.notice_id for n in agent.poll_aws()] == [agent.decider.sent[0].notice_id]
    assert len(sent) == 1 and agent.unsent == []


POOL = REPLICA.pool_id
SHARE = Share(identity=Identity(region="eu1", service="rank", model="baseline",
                                accelerator="a100", tier="opportunistic"),
              accelerator_units=2.0, cpu_units=3.5)


def _lending(imds: FakeImds | None, ready: list[bool]) -> tuple[CapacityAgent, list[object]]:
    """An agent that lends SHARE; ``ready`` scripts the worker's /readyz (last one repeats).
    Everything it sends, notices and capacity events, lands in one list in order."""
    out: list[object] = []
    clock = iter(range(NOW, NOW + 10_000_000, 1_000))

    def probe() -> WorkerProbe:
        return WorkerProbe(ready=ready.pop(0) if len(ready) > 1 else ready[0], pool_id=POOL)

    def send(event: object) -> bool:
        out.append(event)
        return True

    agent = CapacityAgent(NoticeDecider(REPLICA), send, imds=imds,  # type: ignore[arg-type]
                          clock=lambda: next(clock), lender=Lender("w1"), share=lambda: SHARE,
                          send_capacity=send, probe=probe)
    return agent, out


def _kinds(out: list[object]) -> list[str]:
    return [e.kind if isinstance(e, CapacityEvent) else "notice" for e in out]


def test_lends_once_the_worker_is_ready_and_renews(caplog: pytest.LogCaptureFixture) -> None:
    agent, out = _lending(None, [False, True])
    with caplog.at_level(logging.WARNING):
        assert agent.lend() == []
        assert "worker not ready" in caplog.text
        (grant,) = agent.lend()
    assert (grant.replica, grant.accelerator_units, grant.cpu_units) == ("w1", 2.0, 3.5)
    for _ in range(5):  # a tick a second: renewed after renew_s (5 s)
        agent.lend()
    assert _kinds(out) == ["grant", "grant"]


def test_a_spot_interruption_sends_the_notice_then_revokes_and_never_grants_again() -> None:
    imds = FakeImds({INSTANCE_ACTION: [None, GOOD], REBALANCE: [None]})
    agent, out = _lending(imds, [True])
    agent.poll_aws()
    agent.lend()
    agent.poll_aws()
    for _ in range(10):
        agent.lend()
    assert _kinds(out) == ["grant", "notice", "revoke"]
    notice = out[1]
    assert isinstance(notice, PreemptionNotice)  # priced by what was lent
    assert (notice.accelerator_units, notice.cpu_units) == (2.0, 3.5)


def test_termination_notice_then_revoke_and_exit_sends_nothing_more() -> None:
    agent, out = _lending(None, [True])
    agent.lend()
    assert agent.terminate("prestop") is not None
    assert agent.close() == []
    assert _kinds(out) == ["grant", "notice", "revoke"]


def test_exit_revokes_a_live_grant() -> None:
    agent, out = _lending(None, [True])
    agent.lend()
    assert [e.kind for e in agent.close()] == ["revoke"]
    assert _kinds(out) == ["grant", "revoke"]
