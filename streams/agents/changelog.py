"""Reading back the control plane's compacted state changelog for newly assigned partitions."""

from __future__ import annotations

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from schemas.kafka_config import KafkaSettings


def read_changelog(kafka: KafkaSettings, topic: str, partitions: list[int],
                   timeout_s: float = 60.0) -> dict[str, bytes]:
    """Latest value per key in `partitions` of `topic`, read from the start to the high mark.

    Blocking (run it in a thread). A topic that does not exist yet holds no state.
    """
    if not partitions:
        return {}
    consumer = Consumer(kafka.confluent(**{"group.id": f"{topic}-restore",
                                           "enable.auto.commit": False,
                                           "enable.partition.eof": True}))
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return {}
        todo = {}
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p),
                                                       timeout=timeout_s)
            if high > low:
                todo[p] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        latest: dict[str, bytes] = {}
        while todo:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() != -191:  # _PARTITION_EOF
                    raise KafkaException(msg.error())
                continue
            key = msg.key().decode()
            if msg.value() is None:
                latest.pop(key, None)
            else:
                latest[key] = msg.value()
            if msg.offset() + 1 >= todo.get(msg.partition(), 0):
                todo.pop(msg.partition(), None)
        return latest
    finally:
        consumer.close()
