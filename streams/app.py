"""The Faust app of the control plane: `faust -A streams.app worker` or `surplus control-plane`.

This module and `streams/agents/` are the only places that import faust. The app is built from
settings so tests and the CLI can make their own; the module-level `app` reads the environment.
"""

from __future__ import annotations

import ssl
from typing import Any

import faust

from schemas.kafka_config import KafkaSettings
from streams.control.config import ControlConfig, load_config
from streams.settings import ControlPlaneSettings


def broker_kwargs(kafka: KafkaSettings) -> dict[str, Any]:
    """Faust broker URL and credentials from the one Kafka settings block."""
    from streams.agents.transport import SCHEME

    urls = ";".join(f"{SCHEME}://{host.strip()}" for host in kafka.bootstrap.split(","))
    kwargs: dict[str, Any] = {"broker": urls}
    context = _ssl_context(kafka) if kafka.uses_ssl else None
    if kafka.sasl_mechanism:
        kwargs["broker_credentials"] = faust.SASLCredentials(
            username=kafka.sasl_username,
            password=kafka.sasl_password.get_secret_value() if kafka.sasl_password else None,
            mechanism=kafka.sasl_mechanism, ssl_context=context)
    elif context is not None:
        kwargs["broker_credentials"] = faust.SSLCredentials(context)
    return kwargs


def _ssl_context(kafka: KafkaSettings) -> ssl.SSLContext:
    """The TLS context aiokafka uses, equivalent to what `KafkaSettings.confluent()` tells
    librdkafka: the CA file (or the system's), the client certificate for mTLS, hostname check.
    """
    context = ssl.create_default_context(cafile=kafka.ssl_cafile)
    context.check_hostname = kafka.ssl_check_hostname
    if kafka.ssl_certfile and kafka.ssl_keyfile:
        password = kafka.ssl_keyfile_password
        context.load_cert_chain(kafka.ssl_certfile, kafka.ssl_keyfile,
                                password=password.get_secret_value() if password else None)
    return context


def create_app(kafka: KafkaSettings | None = None, settings: ControlPlaneSettings | None = None,
               config: ControlConfig | None = None) -> faust.App:
    """A configured app with the control agents registered on it."""
    from streams.agents.control import ControlPlane

    kafka = kafka or KafkaSettings()
    settings = settings or ControlPlaneSettings()
    if config is None:
        config = load_config(settings.config_path) if settings.config_path else ControlConfig()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        settings.app_id,
        **broker_kwargs(kafka),
        store="memory://",
        topic_partitions=settings.partitions,
        # `surplus control-plane` creates the topics first, replicated as the cluster allows;
        # a bare `faust -A streams.app worker` that creates them gets one replica unless told.
        topic_replication_factor=settings.replication_factor or 1,
        topic_disable_leader=True,
        topic_allow_declare=settings.declare_topics,
        web_enabled=False,
        datadir=str(settings.data_dir),
        consumer_auto_offset_reset="earliest",
        broker_commit_every=1000,
        broker_commit_interval=1.0,
        stream_wait_empty=False,
        broker_session_timeout=settings.session_timeout_s,
        # A member hears of a rebalance at its next heartbeat: at 1 s a clean hand-over costs
        # one control period at most (at Faust's 3 s it cost up to three).
        broker_heartbeat_interval=min(1.0, settings.session_timeout_s / 3),
        producer_linger=0.0,
        consumer_group_instance_id=settings.instance_id,
        consumer_metadata_max_age_ms=int(settings.metadata_max_age_s * 1000),
        # Keeps Faust's own partition assignor (co-partitioned assignment, assigned_actives);
        # with no tables and no standbys Faust falls back to round-robin.
        table_standby_replicas=1,
    )
    app.control_plane = ControlPlane(app, kafka, settings, config)  # type: ignore[attr-defined]
    return app


app = create_app()
