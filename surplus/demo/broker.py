"""Kafka for a demo run: the cluster given, or an embedded KRaft broker; then the catalog's
topics, waited on until every partition has a serving leader."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

from schemas.clock import wall_ms
from schemas.kafka_config import KafkaSettings
from surplus import localkafka
from surplus.demo.options import DemoError, Interrupted
from surplus.live.procs import wait_until


def given(bootstrap: str | None, say: Callable[[str], None]) -> str | None:
    """The cluster the run was given: ``bootstrap``, else ``KAFKA_BOOTSTRAP_SERVERS``, else
    ``SURPLUS_KAFKA_BOOTSTRAP``; None when there is none (the run embeds a broker)."""
    found = (bootstrap or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
             or os.environ.get("SURPLUS_KAFKA_BOOTSTRAP"))
    if found:
        say(f"kafka: using {found}")
    return found or None


def embedded(data_dir: Path, say: Callable[[str], None]) -> str:
    """Start an embedded broker with its data in ``data_dir``; returns its bootstrap."""
    localkafka.fetch_jars()
    info, _ = localkafka.up(port=localkafka.free_port(), data_dir=data_dir)
    say(f"kafka: embedded broker at {info.bootstrap} (pid {info.pid}, ready in "
        f"{info.started_in_s or 0:.1f}s)")
    return info.bootstrap


def with_topics(bootstrap: str, prefix: str, say: Callable[[str], None],
                stop: threading.Event) -> KafkaSettings:
    """The run's Kafka settings, once the catalog's topics exist on ``bootstrap`` and serve.

    :param bootstrap: the cluster's bootstrap address.
    :param prefix: the topic-name prefix of this run.
    :param say: prints one line to the user.
    :param stop: set on Ctrl-C: the wait for serving leaders gives up (``Interrupted``).
    """
    try:
        kafka = KafkaSettings(bootstrap=bootstrap, prefix=prefix)
    except ValueError as exc:
        raise DemoError(f"bad Kafka settings: {exc}") from None
    from surplus.topics import apply_topics

    try:
        applied = apply_topics(kafka.confluent(), kafka.prefix)
    except Exception as exc:
        raise DemoError(f"cannot apply topics on {bootstrap}: {exc}") from None
    if not applied.ok:
        raise DemoError("existing topics disagree with the catalog: "
                        + "; ".join(applied.mismatches))
    say(f"topics: {len(applied.created)} created, {len(applied.existing)} existing "
        f"(prefix {kafka.prefix!r})")
    if not wait_until(partial(topics_serve, kafka), 60.0, 0.5, stop=stop.is_set):
        if stop.is_set():
            raise Interrupted
        raise DemoError(f"the new topics on {bootstrap} have no serving leaders after 60s")
    return kafka


def topics_serve(kafka: KafkaSettings) -> bool:
    """Every partition of the logged topics answers an offsets-for-times query (what the
    recorder asks first): freshly created topics take a moment to get serving leaders."""
    from schemas import kafka_clients
    from streams.eventlog import TOPICS

    consumer = kafka_clients.consumer(kafka, "surplus-demo-probe", **{"enable.auto.commit": False})
    try:
        parts = []
        for logical in TOPICS:
            name = kafka.topic(logical)
            partitions = kafka_clients.partitions(consumer, name, timeout_s=5.0)
            parts += kafka_clients.starting_at(name, partitions, wall_ms())
        found = consumer.offsets_for_times(parts, timeout=5.0)
        return all(tp.error is None for tp in found)
    except (kafka_clients.KafkaException, kafka_clients.TopicUnavailable):
        return False
    finally:
        consumer.close()
