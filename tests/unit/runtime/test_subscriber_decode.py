"""A worker's subscribers read each message through one decode: a tombstone is counted, a
message out of the contract is dead-lettered with the codec's reason, the rest is the event."""

from __future__ import annotations

from typing import Any, cast

from schemas.codec import codec_for, encode
from schemas.contract import PreemptionNotice
from workers.runtime.kafka_subscribers import Subscriber


class _Msg:
    def __init__(self, value: bytes | None) -> None:
        self._value = value

    def value(self) -> bytes | None:
        return self._value


class _DeadLetters:
    def __init__(self) -> None:
        self.sent: list[tuple[Any, str]] = []

    def send(self, msg: Any, reason: str) -> None:
        self.sent.append((msg, reason))


class _Settings:
    def topic(self, logical: str) -> str:
        return logical


class _IO:
    def __init__(self) -> None:
        self.worker = None
        self.settings = _Settings()
        self.deadletters = _DeadLetters()


def test_decode_gives_the_event_or_why_there_is_none() -> None:
    io = _IO()
    subscriber = Subscriber(cast(Any, io))
    codec = codec_for(PreemptionNotice)
    notice = PreemptionNotice(notice_id="n1", ts_ms=1, region="eu1", pool_id="p",
                              deadline_ms=2)
    assert subscriber.decode(cast(Any, _Msg(encode(notice))), codec) == notice
    assert subscriber.decode(cast(Any, _Msg(None)), codec) == "tombstone"
    assert io.deadletters.sent == []
    bad = _Msg(b'{"not": "a notice"}')
    assert subscriber.decode(cast(Any, bad), codec) == "deadletter"
    [(msg, reason)] = io.deadletters.sent
    assert msg is bad and reason
