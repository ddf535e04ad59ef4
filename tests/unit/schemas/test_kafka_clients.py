"""Which metadata answers mean a topic holds nothing, and which only that it did not answer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from schemas import kafka_clients
from schemas.kafka_clients import KafkaError, TopicUnavailable
from schemas.kafka_config import KafkaSettings
from streams.agents import changelog


class Meta:
    """What ``list_topics`` answers: one topic's metadata, or none."""

    def __init__(self, topic: Any) -> None:
        self.topic = topic

    def list_topics(self, name: str, timeout: float) -> Any:
        topics = {} if self.topic is None else {name: self.topic}
        return SimpleNamespace(topics=topics)


def erred(code: int) -> SimpleNamespace:
    return SimpleNamespace(error=KafkaError(code), partitions={})


def test_a_topic_the_broker_does_not_know_is_missing() -> None:
    for client in (Meta(None), Meta(erred(KafkaError.UNKNOWN_TOPIC_OR_PART))):
        with pytest.raises(TopicUnavailable) as raised:
            kafka_clients.partitions(client, "t", 1.0)  # type: ignore[arg-type]
        assert raised.value.missing


def test_a_topic_whose_leader_is_being_elected_is_unavailable_but_not_missing() -> None:
    with pytest.raises(TopicUnavailable) as raised:
        kafka_clients.partitions(Meta(erred(KafkaError.LEADER_NOT_AVAILABLE)),  # type: ignore[arg-type]
                                 "t", 1.0)
    assert not raised.value.missing


class Closing:
    def close(self) -> None:
        pass


@pytest.mark.parametrize(("missing", "read"), [(True, {}), (False, None)])
def test_stored_state_is_empty_only_where_its_topic_is_missing(
        monkeypatch: pytest.MonkeyPatch, missing: bool, read: dict[str, bytes] | None) -> None:
    def unavailable(*_: Any) -> list[int]:
        raise TopicUnavailable("t: not answered", missing=missing)

    monkeypatch.setattr(kafka_clients, "consumer", lambda *_, **__: Closing())
    monkeypatch.setattr(kafka_clients, "partitions", unavailable)
    settings = KafkaSettings()
    if read is not None:
        assert changelog.read_changelog(settings, "t", [0]) == read
    else:
        with pytest.raises(TopicUnavailable):  # its state is there, unread: the caller retries
            changelog.read_changelog(settings, "t", [0])
