"""Worker configuration: every bad key is named before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.runtime.config import ConfigError, load_config


def test_pool_id_is_derived_from_identity_unless_given() -> None:
    config = load_config(None, {"worker_id": "w", "tier": "opportunistic",
                                "model.name": "powerful", "accelerator": "a100"})
    assert config.pool == "eu1/rank/powerful/a100/opportunistic"
    assert config.whole_request_optional
    assert load_config(None, {"worker_id": "w", "pool_id": "p1"}).pool == "p1"


@pytest.mark.parametrize(("tier", "model", "whole"), [
    ("baseline", "powerful", False), ("opportunistic", "baseline", False),
    ("opportunistic", "powerful", True)])
def test_only_opportunistic_powerful_replicas_treat_whole_requests_as_optional(
        tier: str, model: str, whole: bool) -> None:
    config = load_config(None, {"worker_id": "w", "tier": tier, "model.name": model})
    assert config.whole_request_optional is whole


@pytest.mark.parametrize(("overrides", "named"), [
    ({}, "missing required field `worker_id`"),
    ({"worker_id": "w", "batching.max_batch_rows": 0}, "`$.batching.max_batch_rows`"),
    ({"worker_id": "w", "admission.level_fractions": [0.9, 0.1]}, "level_fractions"),
    ({"worker_id": "w", "limits.max_coverage": "1"}, "`$.limits.max_coverage`"),
    ({"worker_id": "w", "port": 70_000}, "`$.port`"),
    ({"worker_id": "w b"}, "`$.worker_id`"),
    ({"worker_id": "w", "kafka": {"bootstrap": "x"}}, "`kafka.bootstrap`"),
    ({"worker_id": "w", "kafka": {"colour": "red"}}, "`kafka.colour`"),
    ({"worker_id": "w", "model.path": "/nope/model.pt2"}, "`model.path`"),
    ({"worker_id": "w", "notice_from": ["127.0.0.1/8", "10.0.0/x"]}, "`notice_from[1]`"),
])
def test_bad_values_are_refused_naming_the_key(overrides: dict, named: str) -> None:
    with pytest.raises(ConfigError, match="bad worker config") as info:
        load_config(None, overrides)
    assert named in str(info.value)


def test_toml_file_then_overrides_over_defaults(tmp_path: Path) -> None:
    path = tmp_path / "w.toml"
    path.write_text('worker_id = "from-file"\nport = 9000\n[batching]\nmax_wait_ms = 3.5\n')
    config = load_config(path, {"port": 9100, "region": None},
                         defaults={"worker_id": "default", "region": "us2"})
    assert (config.worker_id, config.port, config.region) == ("from-file", 9100, "us2")
    assert config.batching.max_wait_ms == 3.5


def test_unreadable_or_invalid_toml_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read worker config"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("worker_id = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_kafka_keys_left_out_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SURPLUS_KAFKA_BOOTSTRAP", "broker.example:9093")
    config = load_config(None, {"worker_id": "w", "kafka": {"prefix": "p."}})
    settings = config.kafka_settings()
    assert settings is not None
    assert (settings.bootstrap, settings.prefix) == ("broker.example:9093", "p.")
    assert load_config(None, {"worker_id": "w"}).kafka_settings() is None
