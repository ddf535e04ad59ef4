"""Process settings reach the Faust app as meant, and a bad one stops it naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.kafka_config import KafkaSettings
from streams.app import create_app
from streams.settings import ControlPlaneSettings


def test_instance_id_makes_the_consumer_a_static_group_member(tmp_path: Path) -> None:
    settings = ControlPlaneSettings(instance_id="cp-0", data_dir=tmp_path)
    app = create_app(KafkaSettings(bootstrap="127.0.0.1:9"), settings)
    assert app.conf.consumer_group_instance_id == "cp-0"
    dynamic = create_app(KafkaSettings(bootstrap="127.0.0.1:9"),
                         ControlPlaneSettings(data_dir=tmp_path))
    assert dynamic.conf.consumer_group_instance_id is None
    assert dynamic.conf.broker_heartbeat_interval == 1.0


def test_faust_declares_topics_unless_told_they_are_there(tmp_path: Path) -> None:
    """Declaring asks the controller broker: a start while it is down crashed the conductor
    (found by `surplus chaos`), so `surplus control-plane` turns it off once it has found
    every topic."""
    kafka = KafkaSettings(bootstrap="127.0.0.1:9")
    assert create_app(kafka, ControlPlaneSettings(data_dir=tmp_path)).conf.topic_allow_declare
    told = create_app(kafka, ControlPlaneSettings(data_dir=tmp_path, declare_topics=False))
    assert told.conf.topic_allow_declare is False


def test_the_join_disk_takes_its_memory_bounds_from_the_settings(tmp_path: Path) -> None:
    """RocksDB's memory is what bounds the process's RSS whatever the decision rate; the
    settings' defaults are the store's own."""
    from streams.agents.pending import DiskSettings

    defaults = ControlPlaneSettings(data_dir=tmp_path)
    assert (defaults.pending_write_buffer_mb, defaults.pending_block_cache_mb) == (
        DiskSettings().write_buffer_mb, DiskSettings().block_cache_mb)
    app = create_app(KafkaSettings(bootstrap="127.0.0.1:9"), ControlPlaneSettings(
        data_dir=tmp_path, pending_write_buffer_mb=8, pending_block_cache_mb=16))
    disk = app.control_plane.pending.disk  # type: ignore[attr-defined]
    assert disk.settings == DiskSettings(write_buffer_mb=8, block_cache_mb=16)
    with pytest.raises(ValidationError, match="pending_block_cache_mb"):
        ControlPlaneSettings(pending_block_cache_mb=0)


def test_the_consumer_rereads_partition_leaders_within_the_metadata_age(tmp_path: Path) -> None:
    """aiokafka's committed-offset reset retries a former leader without asking for new
    metadata; only the periodic refresh ends that (a 77 s stall without targets in `surplus
    chaos --seed 4` under the 5 min default)."""
    kafka = KafkaSettings(bootstrap="127.0.0.1:9")
    app = create_app(kafka, ControlPlaneSettings(data_dir=tmp_path))
    assert app.conf.consumer_metadata_max_age_ms == 5000
    slower = create_app(kafka, ControlPlaneSettings(data_dir=tmp_path, metadata_max_age_s=30))
    assert slower.conf.consumer_metadata_max_age_ms == 30_000
    with pytest.raises(ValidationError, match="metadata_max_age_s"):
        ControlPlaneSettings(metadata_max_age_s=0)


@pytest.mark.parametrize("bad", ["", "has space", "x" * 250])
def test_a_bad_instance_id_is_refused_naming_the_key(bad: str) -> None:
    with pytest.raises(ValidationError, match="instance_id"):
        ControlPlaneSettings(instance_id=bad)


def test_the_faust_worker_leaves_the_root_logger_at_the_chosen_level(tmp_path: Path) -> None:
    """Faust's spinner would set the root logger to DEBUG, so that every debug line of the
    Kafka client's fetch loop is built and handled: a CPU cost on every fetch."""
    import logging

    from faust import Worker

    from surplus.control_cmd import faust_worker

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    app = create_app(KafkaSettings(bootstrap="127.0.0.1:9"),
                     ControlPlaneSettings(data_dir=tmp_path))
    worker = faust_worker(Worker, app, "warning")
    try:
        worker._setup_logging()
        assert root.getEffectiveLevel() == logging.WARNING
        assert not logging.getLogger("aiokafka").isEnabledFor(logging.DEBUG)
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers
