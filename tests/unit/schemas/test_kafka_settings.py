"""One settings block configures every Kafka client: each protocol maps to the librdkafka keys it
needs, secrets stay out of reprs and errors, and a bad combination names the offending key."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas.kafka_config import KafkaSettings


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, str]:
    files = {}
    for name in ("ca", "cert", "key"):
        path = tmp_path / f"{name}.pem"
        path.write_text("-----BEGIN TEST-----\n")
        files[name] = str(path)
    return files


def _error_of(**kw: object) -> str:
    with pytest.raises(ValidationError) as err:
        KafkaSettings(**kw)  # type: ignore[arg-type]
    return str(err.value)


def test_mutual_tls_maps_to_librdkafka_certificate_keys(pem: dict[str, str]) -> None:
    config = KafkaSettings(security_protocol="SSL", ssl_cafile=pem["ca"],
                           ssl_certfile=pem["cert"], ssl_keyfile=pem["key"],
                           ssl_keyfile_password="kp").confluent()
    assert config["security.protocol"] == "SSL"
    assert config["ssl.ca.location"] == pem["ca"]
    assert (config["ssl.certificate.location"], config["ssl.key.location"]) == (pem["cert"],
                                                                                pem["key"])
    assert config["ssl.key.password"] == "kp"
    assert config["ssl.endpoint.identification.algorithm"] == "https"
    assert not any(k.startswith("sasl.") for k in config)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_ssl_maps_mechanism_credentials_and_trust(pem: dict[str, str],
                                                      mechanism: str) -> None:
    config = KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism=mechanism,
                           sasl_username="u", sasl_password="p", ssl_cafile=pem["ca"],
                           ssl_check_hostname=False).confluent()
    assert (config["sasl.mechanism"], config["sasl.username"], config["sasl.password"]) == (
        mechanism, "u", "p")
    assert config["ssl.ca.location"] == pem["ca"]
    assert config["ssl.endpoint.identification.algorithm"] == "none"


def test_plaintext_sends_no_security_keys() -> None:
    config = KafkaSettings().confluent()
    assert config["security.protocol"] == "PLAINTEXT"
    assert not any(k.startswith(("sasl.", "ssl.")) for k in config)


def test_password_never_shows_in_repr_or_errors(pem: dict[str, str]) -> None:
    settings = KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                             sasl_username="u", sasl_password="hunter2")
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings.model_dump())
    message = _error_of(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u",
                        sasl_password="hunter2", ssl_cafile=pem["ca"] + ".missing")
    assert "hunter2" not in message


def test_missing_certificate_file_names_the_key(pem: dict[str, str]) -> None:
    message = _error_of(security_protocol="SSL", ssl_cafile=pem["ca"] + ".missing")
    assert "ssl_cafile" in message and "does not exist" in message


@pytest.mark.parametrize(("kw", "named"), [
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u"},
     "sasl_password is required"),
    ({"sasl_mechanism": "PLAIN"}, "sasl_mechanism is set but security_protocol is PLAINTEXT"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": "u",
      "sasl_password": "p", "ssl_cafile": "CA"}, "ssl_cafile is set but"),
    ({"security_protocol": "SSL", "ssl_certfile": "CERT"}, "given together"),
    ({"sasl_mechanism": "GSSAPI"}, "sasl_mechanism"),
    ({"security_protocol": "TLS"}, "security_protocol"),
])
def test_inconsistent_security_settings_name_the_key(pem: dict[str, str], kw: dict[str, str],
                                                     named: str) -> None:
    kw = {k: pem["ca"] if v == "CA" else pem["cert"] if v == "CERT" else v for k, v in kw.items()}
    assert named in _error_of(**kw)


def test_environment_configures_every_key(pem: dict[str, str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"BOOTSTRAP": "k1:9093,k2:9093", "SECURITY_PROTOCOL": "SASL_SSL",
           "SASL_MECHANISM": "SCRAM-SHA-512", "SASL_USERNAME": "control",
           "SASL_PASSWORD": "s3", "SSL_CAFILE": pem["ca"]}
    for key, value in env.items():
        monkeypatch.setenv(f"SURPLUS_KAFKA_{key}", value)
    config = KafkaSettings().confluent()
    assert config["bootstrap.servers"] == "k1:9093,k2:9093"
    assert (config["sasl.mechanism"], config["sasl.password"]) == ("SCRAM-SHA-512", "s3")


def test_every_producer_waits_for_all_in_sync_replicas_and_is_idempotent() -> None:
    config = KafkaSettings().producer(**{"linger.ms": 0})
    assert config["acks"] == "all" and config["enable.idempotence"] is True
    assert config["partitioner"] == "murmur2_random" and config["linger.ms"] == 0


def test_topics_are_replicated_to_three_brokers_at_most_tolerating_one_lost() -> None:
    from schemas.topics import min_insync_for, replication_for

    assert [replication_for(n) for n in (1, 2, 3, 5)] == [1, 2, 3, 3]
    assert [min_insync_for(rf) for rf in (1, 2, 3)] == [1, 1, 2]
    with pytest.raises(ValueError, match="at least one broker"):
        replication_for(0)
