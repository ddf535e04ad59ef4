"""Extra listeners of a local broker: TLS and SASL as a secured production cluster has
(`SecuredListeners`), or the client listener behind a TCP proxy (`BehindProxy`); each appends
its block to the broker's server.properties."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from surplus.localkafka.jvm import INFRA_DIR, BrokerError


@dataclass(frozen=True)
class SecuredListeners:
    """Extra listeners that make the local broker look like a secured production cluster.

    ``ssl_port`` takes mutual TLS (the principal is the client certificate's CN);
    ``sasl_ssl_port`` takes SCRAM-SHA-256, SCRAM-SHA-512 (``scram_users``, created at format
    time) and PLAIN (``plain_users``). The PLAINTEXT port stays open on loopback as the
    operator's (principal ANONYMOUS, a super user). With ``acls`` on, every other principal is
    denied what no ACL allows. Key material is PEM: ``keystore`` holds the broker's private key
    (PKCS#8, unencrypted) and certificate chain, ``truststore`` the CA certificates.
    """

    ssl_port: int
    sasl_ssl_port: int
    keystore: Path
    truststore: Path
    scram_users: Mapping[str, str] = field(default_factory=dict)
    plain_users: Mapping[str, str] = field(default_factory=dict)
    super_users: tuple[str, ...] = ("ANONYMOUS",)
    acls: bool = True

    def ports(self) -> tuple[int, int]:
        return self.ssl_port, self.sasl_ssl_port

    def properties(self, port: int, controller_port: int) -> str:
        """The secured block appended to the broker's server.properties."""
        for name, password in {**self.scram_users, **self.plain_users}.items():
            if not _SAFE_CREDENTIAL.issuperset(name + password) or not name or not password:
                raise BrokerError(f"user {name!r}: names and passwords of the local broker "
                                  f"use letters, digits and -._ only")
        plain = "".join(f' user_{n}="{p}"' for n, p in sorted(self.plain_users.items()))
        authorizer = ("authorizer.class.name="
                      "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
                      if self.acls else "")
        template = (INFRA_DIR / "secured.properties.template").read_text()
        return template.format(
            port=port, controller_port=controller_port, ssl_port=self.ssl_port,
            sasl_ssl_port=self.sasl_ssl_port, keystore=self.keystore.resolve(),
            truststore=self.truststore.resolve(), plain_users=plain, authorizer=authorizer,
            super_users=";".join(f"User:{u}" for u in self.super_users))

    def format_args(self) -> list[str]:
        """StorageTool arguments that create the SCRAM users in the KRaft metadata."""
        args = []
        for name, password in sorted(self.scram_users.items()):
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                args += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
        return args


@dataclass(frozen=True)
class BehindProxy:
    """The broker as clients reach it through a TCP proxy on ``proxy_port`` (toxiproxy in the
    network fault test): the client listener advertises the proxy's port, so a client that
    bootstraps through the proxy is told to connect to the proxy again, never past it.

    Brokers talk to one another on a listener of their own (``direct_port``, advertised as
    itself), so cutting the proxy cuts the clients and not the broker from itself.
    """

    proxy_port: int
    direct_port: int

    def ports(self) -> tuple[int]:
        return (self.direct_port,)

    def properties(self, port: int, controller_port: int) -> str:
        """The listener block appended to the broker's server.properties."""
        template = (INFRA_DIR / "proxied.properties.template").read_text()
        return template.format(port=port, controller_port=controller_port,
                               proxy_port=self.proxy_port, direct_port=self.direct_port)


_SAFE_CREDENTIAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._")
