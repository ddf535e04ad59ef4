"""The capacity agent's loop around its decisions: bad or missing metadata is a log line and no
notice, and polling goes on; a notice the broker did not take is sent again, never dropped."""

from __future__ import annotations

import logging

import pytest

from schemas.contract import PreemptionNotice
from workers.capacity.agent import INSTANCE_ACTION, REBALANCE, CapacityAgent
from workers.capacity.decide import NoticeDecider, Replica
from workers.capacity.imds import ImdsError

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
