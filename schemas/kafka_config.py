"""One settings block for every Kafka client in Surplus (Faust/aiokafka and confluent-kafka).

Read from the environment (`SURPLUS_KAFKA_*`) or built in code; validated once at start so a
bad value stops the process with the offending key. This module only builds plain config
dicts: the packages that own a Kafka client turn them into that client's objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.topics import DEFAULT_PREFIX

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class KafkaSettings(BaseSettings):
    """Where the cluster is and how to authenticate; `prefix` namespaces every topic."""

    model_config = SettingsConfigDict(env_prefix="SURPLUS_KAFKA_", frozen=True, extra="forbid")

    bootstrap: str = Field(default="127.0.0.1:9092", min_length=3)
    prefix: str = DEFAULT_PREFIX
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    #: A secret: never shown by repr() or in a validation error.
    sasl_password: SecretStr | None = None
    #: CA certificate(s) (PEM) that signed the brokers' certificates; default: the system's.
    ssl_cafile: str | None = None
    #: Client certificate and key (PEM) for mutual TLS; given together.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_keyfile_password: SecretStr | None = None
    #: Check that a broker's certificate names the host connected to. Turn off only for a
    #: cluster whose certificates lack the advertised host names.
    ssl_check_hostname: bool = True
    client_id: str = "surplus"

    @field_validator("ssl_cafile", "ssl_certfile", "ssl_keyfile")
    @classmethod
    def _readable(cls, path: str | None) -> str | None:
        """A missing file is a config error now, not a TLS failure on the first connection."""
        if path is not None and not Path(path).is_file():
            raise ValueError(f"file {path} does not exist")
        return path

    @model_validator(mode="after")
    def _check_security(self) -> KafkaSettings:
        protocol = self.security_protocol
        if protocol.startswith("SASL"):
            for key in ("sasl_mechanism", "sasl_username", "sasl_password"):
                if not getattr(self, key):
                    raise ValueError(f"{key} is required when security_protocol is {protocol}")
        else:
            for key in ("sasl_mechanism", "sasl_username", "sasl_password"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} is set but security_protocol is {protocol} "
                                     f"(SASL_SSL or SASL_PLAINTEXT use it)")
        if not self.uses_ssl:
            for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} is set but security_protocol is {protocol} "
                                     f"(SSL or SASL_SSL use it)")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile must be given together (mTLS)")
        return self

    @property
    def uses_ssl(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def confluent(self, **extra: Any) -> dict[str, Any]:
        """librdkafka configuration for confluent-kafka producers, consumers and admin."""
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap,
                                  "security.protocol": self.security_protocol,
                                  "client.id": self.client_id}
        if self.sasl_mechanism and self.sasl_password is not None:
            config.update({"sasl.mechanism": self.sasl_mechanism,
                           "sasl.username": self.sasl_username,
                           "sasl.password": self.sasl_password.get_secret_value()})
        if self.uses_ssl:
            config["ssl.endpoint.identification.algorithm"] = (
                "https" if self.ssl_check_hostname else "none")
        if self.ssl_cafile:
            config["ssl.ca.location"] = self.ssl_cafile
        if self.ssl_certfile:
            config.update({"ssl.certificate.location": self.ssl_certfile,
                           "ssl.key.location": self.ssl_keyfile})
        if self.ssl_keyfile_password is not None:
            config["ssl.key.password"] = self.ssl_keyfile_password.get_secret_value()
        config.update(extra)
        return config

    def producer(self, **extra: Any) -> dict[str, Any]:
        """Producer config: murmur2 partitioning, so a scope key maps to the same partition as
        from Faust/aiokafka and the Java client (co-partitioned topics depend on it); acks from
        every in-sync replica and idempotence, so a message acknowledged survives the loss of
        its leader and a retry after a lost acknowledgement does not write it twice (a
        notice or a target read twice is harmless; a telemetry window merged twice is not)."""
        return self.confluent(**{"partitioner": "murmur2_random", "linger.ms": 5,
                                 "acks": "all", "enable.idempotence": True, **extra})

    def topic(self, logical: str) -> str:
        from schemas.topics import topic_name

        return topic_name(logical, self.prefix)
