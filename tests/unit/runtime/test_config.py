"""Worker configuration: every bad key is named before anything starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workers.runtime.config import ConfigError, check_precompute_kafka, load_config


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


OIP = {"url": "http://triton:8000", "model_name": "ranker"}


@pytest.mark.parametrize(("overrides", "named"), [
    ({"model.backend": "oip"}, "`model.oip`"),
    ({"model.backend": "grpc"}, "`$.model.backend`"),
    ({"model.oip": OIP}, "`model.backend`"),
    ({"model.backend": "oip", "model.oip": OIP, "model.path": "/m.pt2"}, "`model.path`"),
    ({"model.backend": "oip", "model.oip": {**OIP, "url": "triton:8000"}}, "`$.model.oip.url`"),
    ({"model.backend": "oip", "model.oip": {"url": "http://t:8000"}},
     "missing required field `model_name` - at `$.model.oip`"),
    ({"model.backend": "oip", "model.oip": {**OIP, "timeout_s": 0}}, "`$.model.oip.timeout_s`"),
    ({"model.backend": "oip", "model.oip": {**OIP, "colour": "red"}}, "`$.model.oip`"),
])
def test_a_bad_model_server_config_is_refused_naming_the_key(overrides: dict, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, {"worker_id": "w", **overrides})
    assert named in str(info.value)


def test_the_model_server_backend_is_read_from_the_model_table(tmp_path: Path) -> None:
    path = tmp_path / "worker.toml"
    path.write_text('worker_id = "w"\n[model]\nbackend = "oip"\n[model.oip]\n'
                    'url = "http://mlserver:8080/prefix"\nmodel_name = "ranker"\n'
                    'timeout_s = 0.5\noutput = "predict"\n')
    model = load_config(path).model
    assert model.backend == "oip" and model.oip is not None
    assert (model.oip.url, model.oip.model_name, model.oip.timeout_s, model.oip.output) == (
        "http://mlserver:8080/prefix", "ranker", 0.5, "predict")
    assert (model.oip.dense_input, model.oip.sparse_input) == ("dense", "sparse")


def test_declared_model_inputs_are_read_from_toml_next_to_the_model_path(tmp_path: Path) -> None:
    model = tmp_path / "ranker.pt2"
    model.write_bytes(b"")
    path = tmp_path / "worker.toml"
    path.write_text(f'worker_id = "w"\n[model]\npath = "{model}"\n'
                    '[[model.inputs]]\nname = "user"\nkind = "request_dense"\nsize = 13\n'
                    '[[model.inputs]]\nname = "history"\nkind = "multi_hot"\n'
                    'cardinality = 1000\n')
    signature = load_config(path).model.signature()
    assert signature.names() == ["user", "history"]
    assert [a.name for a in signature.args()] == ["user", "history_values", "history_offsets"]
    assert load_config(None, {"worker_id": "w"}).model.signature().names() == ["dense", "sparse"]


@pytest.mark.parametrize(("inputs", "named"), [
    ([{"name": "a", "kind": "sparse"}], "a sparse input needs `size` - at `$.model.inputs[0]`"),
    ([{"name": "a", "kind": "multi_hot"}, {"name": "a_offsets", "kind": "sparse", "size": 1}],
     "`model.inputs[1].name`: 'a_offsets' is also the name of `model.inputs[0]`"),
    ([{"name": "a", "kind": "sparse", "size": 1}],
     "`model.inputs`: the reference models take the fixed dense and sparse inputs"),
])
def test_bad_model_inputs_are_refused_at_start_naming_the_key(inputs: list[dict],
                                                              named: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_config(None, {"worker_id": "w", "model.inputs": inputs})


def test_precompute_on_a_baseline_replica_or_without_kafka_stops_the_worker_naming_the_key(
) -> None:
    with pytest.raises(ConfigError, match=r"`precompute.enabled`: only an opportunistic"):
        load_config(None, {"worker_id": "w1", "precompute.enabled": True,
                           "kafka": {"bootstrap": "127.0.0.1:1"}})
    lent = load_config(None, {"worker_id": "w1", "precompute.enabled": True,
                              "tier": "opportunistic"})  # --bootstrap may still give Kafka
    with pytest.raises(ConfigError, match=r"`precompute.enabled`: .*no \[kafka\] table"):
        check_precompute_kafka(lent)
    config = load_config(None, {"worker_id": "w1", "precompute.enabled": True,
                                "tier": "opportunistic", "kafka": {"bootstrap": "127.0.0.1:1"}})
    assert config.precompute.enabled and config.precompute.chunk_ms == 1.0
