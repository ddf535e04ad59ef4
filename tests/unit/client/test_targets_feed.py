"""The client's targets feed dead-letters a target by the target state's verdict, as the worker
does: a retired key's expired target read back from the compacted topic is counted expired and
not dead-lettered; one still within its TTL is refused for its key and dead-lettered."""

from __future__ import annotations

import base64
from typing import Any

from schemas.codec import encode
from schemas.contract import ControlTargets, DeadLetter
from schemas.kafka_config import KafkaSettings
from schemas.signing import Keyring
from tests.unit.policy.helpers import T0, targets
from workers.client.client import RankingClient
from workers.client.config import ClientConfig
from workers.client.feed import TargetsFeed

OLD = Keyring({"old": b"o" * 32}, "old")
NEW = Keyring({"new": b"n" * 32}, "new")


class _Msg:
    """What the feed reads of a Kafka message."""

    def __init__(self, value: bytes, offset: int) -> None:
        self._value, self._offset = value, offset

    def key(self) -> bytes:
        return b"eu1"

    def value(self) -> bytes:
        return self._value

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


def _read(*offered: ControlTargets) -> tuple[RankingClient, list[DeadLetter]]:
    """A client holding only the new key reads ``offered`` through its feed at T0."""
    client = RankingClient(ClientConfig(scope="eu1", baseline_urls=["http://b.invalid"]),
                           signing_key=NEW, clock=lambda: T0)
    letters: list[DeadLetter] = []
    feed = TargetsFeed(KafkaSettings(), "eu1", client.apply_targets, letters.append)
    for offset, target in enumerate(offered):
        msg: Any = _Msg(encode(target), offset)
        feed._handle(msg)
    return client, letters


def test_a_retired_keys_expired_target_is_counted_expired_and_not_dead_lettered() -> None:
    left_on_topic = OLD.sign(targets(epoch=3, issued_at_ms=T0 - 60_000, ttl_ms=12_000))
    client, letters = _read(left_on_topic)
    assert letters == []
    assert client.decider.targets.counters == {"expired": 1}


def test_a_retired_keys_target_within_its_ttl_is_refused_and_dead_lettered_with_its_offset(
) -> None:
    replayed = OLD.sign(targets(epoch=3, issued_at_ms=T0 - 1_000, ttl_ms=12_000))
    client, letters = _read(NEW.sign(targets(epoch=1, issued_at_ms=T0 - 500)), replayed)
    assert client.decider.targets.counters == {"applied": 1, "unknown_key": 1}
    assert [(d.offset, d.reason) for d in letters] == [
        (1, "ControlTargets: unknown_key (key id old)")]
    assert base64.b64decode(letters[0].value_b64) == encode(replayed)
    assert client.decider.targets.epoch == 1
