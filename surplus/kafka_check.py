"""A start-up check of the Kafka settings against the cluster, before any component starts.

Wrong credentials, a broker certificate the CA file does not vouch for, or a client
certificate the broker refuses are configuration errors: retrying will never fix them, and
Faust or a background consumer would otherwise retry them forever (or die later with a
traceback). `check` asks the cluster for metadata once with the real settings and turns those
failures into one line naming the setting to look at. A cluster that simply does not answer
yet is not a configuration error: the caller decides (workers serve baseline until it answers).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from schemas import kafka_clients
from schemas.kafka_clients import KafkaError, KafkaException
from schemas.kafka_config import KafkaSettings

Outcome = Literal["ok", "unreachable"]

#: librdkafka error codes that mean "this configuration cannot work", with the hint to show.
_FATAL: dict[int, str] = {
    KafkaError._AUTHENTICATION: "check sasl_mechanism / sasl_username / sasl_password "
                                "(SURPLUS_KAFKA_SASL_*)",
    KafkaError.SASL_AUTHENTICATION_FAILED: "check sasl_mechanism / sasl_username / "
                                           "sasl_password (SURPLUS_KAFKA_SASL_*)",
    KafkaError._SSL: "check ssl_cafile / ssl_certfile / ssl_keyfile and security_protocol "
                     "(SURPLUS_KAFKA_SSL_*, SURPLUS_KAFKA_SECURITY_PROTOCOL)",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "the principal may not describe the cluster "
                                             "(see the ACLs in docs/security.md)",
}


class KafkaAccessError(RuntimeError):
    """The cluster refused these settings; the message is one line and names what to fix."""


@dataclass
class CheckResult:
    outcome: Outcome
    seconds: float
    brokers: int = 0
    transient: list[str] = field(default_factory=list)


def check(settings: KafkaSettings, timeout_s: float = 15.0) -> CheckResult:
    """Ask the cluster for metadata with `settings`; raise KafkaAccessError on a config error.

    Returns "ok" once metadata arrives, "unreachable" if nothing answered within `timeout_s`
    and nothing said the configuration is wrong.
    """
    fatal: list[KafkaError] = []
    transient: list[str] = []

    def on_error(err: KafkaError) -> None:
        if _hint(err) is not None:
            fatal.append(err)
        else:
            transient.append(err.str())

    started = time.monotonic()
    try:
        admin = kafka_clients.admin(settings, **{
            "error_cb": on_error, "logger": kafka_clients.silent_logger(
                "surplus.kafka_check.librdkafka"), "log_level": 0,
            "socket.timeout.ms": 5000, "reconnect.backoff.max.ms": 1000})
    except KafkaException as exc:  # librdkafka refused the config itself (e.g. a bad PEM)
        raise KafkaAccessError(f"Kafka client configuration refused: {_first_line(exc)}"
                               ) from None
    deadline = started + timeout_s
    while True:
        try:
            meta = admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
        except KafkaException as exc:
            err = kafka_clients.kafka_error(exc)
            if err is not None and _hint(err):
                fatal.append(err)
            meta = None
        admin.poll(0)
        if fatal:
            raise KafkaAccessError(_explain(settings, fatal[0]))
        if meta is not None and meta.brokers:
            return CheckResult("ok", time.monotonic() - started, len(meta.brokers), transient)
        if time.monotonic() >= deadline:
            return CheckResult("unreachable", time.monotonic() - started, 0, transient)


def _hint(err: KafkaError) -> str | None:
    """What to fix when `err` means the configuration cannot work, else None (transient)."""
    hint = _FATAL.get(err.code())
    if hint is None and err.code() == KafkaError._TRANSPORT:
        text = err.str().lower()
        if "alert" in text and "certificate" in text:  # the broker refused our certificate
            hint = ("the broker refused the client certificate: check ssl_certfile / "
                    "ssl_keyfile (SURPLUS_KAFKA_SSL_*), signed by a CA the broker trusts")
    return hint


def _explain(settings: KafkaSettings, err: KafkaError) -> str:
    who = (f" as {settings.sasl_mechanism} user {settings.sasl_username!r}"
           if settings.sasl_mechanism else "")
    return (f"Kafka at {settings.bootstrap} refused the connection{who} over "
            f"{settings.security_protocol}: {_first_line(err.str())} — {_hint(err)}")


def _first_line(text: object) -> str:
    return str(text).strip().splitlines()[0][:400] if str(text).strip() else "no detail"
