"""Surplus next to a secured cluster: TLS, mutual TLS, SASL (SCRAM-SHA-256/512, PLAIN) and
ACLs that deny whatever the table in docs/security.md does not grant.

One local broker (a CA and certificates made for this run) serves three listeners: PLAINTEXT on
loopback for the operator's super user (it only creates ACLs), SSL with client certificates
required, and SASL_SSL. Each component runs as its own principal with exactly the ACLs of
`surplus.acls`: the operator applies the topics over SCRAM, the scheduler grants capacity over
PLAIN, the control plane runs over SCRAM-SHA-512, a worker over mutual TLS, a ranking client over
SCRAM-SHA-256; targets are signed and flow end to end. Wrong credentials stop a component at
start with one line naming what to fix.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from schemas import kafka_clients
from schemas.contract import ControlTargets
from schemas.kafka_clients import AclBinding, AdminClient, KafkaError, NewTopic
from schemas.kafka_config import KafkaSettings
from schemas.signing import verifier
from surplus import acls, localkafka
from surplus.topics import apply_topics
from tests.faults.load import LoadRunner
from tests.integration.fleet import (
    RMA_POOL,
    ControlProc,
    WorkerProc,
    control_toml,
    grant,
    kafka_env,
    metric,
)
from tests.integration.harness import TopicReader
from tests.integration.worker_support import body
from tests.security.pki import Issued, TestCA

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PASSWORDS = {"operator": "op-pw", "control": "cp-pw", "client": "cl-pw"}
PLAIN_USERS = {"scheduler": "sch-pw"}
MATRIX = "matrix."
WRONG = "Wr0ng-pa55"


@dataclass
class Secured:
    """The secured broker and how each principal reaches it."""

    tmp: Path
    ca: TestCA
    port: int
    ssl_port: int
    sasl_port: int
    worker_cert: Issued
    rogue_cert: Issued
    prefix: str

    def operator_admin(self) -> AdminClient:
        """The PLAINTEXT super user: used only to create ACLs."""
        return kafka_clients.admin({"bootstrap.servers": f"127.0.0.1:{self.port}"})

    def super_user(self) -> KafkaSettings:
        """The operator's PLAINTEXT listener on loopback (reads anything, for checks)."""
        return KafkaSettings(bootstrap=f"127.0.0.1:{self.port}", prefix=self.prefix)

    def scram(self, user: str, mechanism: str = "SCRAM-SHA-512", **kw: Any) -> KafkaSettings:
        fields: dict[str, Any] = {
            "bootstrap": f"127.0.0.1:{self.sasl_port}", "prefix": self.prefix,
            "security_protocol": "SASL_SSL", "sasl_mechanism": mechanism,
            "sasl_username": user, "sasl_password": PASSWORDS.get(user, ""),
            "ssl_cafile": str(self.ca.cert_path), **kw}
        return KafkaSettings(**fields)

    def plain(self, user: str) -> KafkaSettings:
        return KafkaSettings(bootstrap=f"127.0.0.1:{self.sasl_port}", prefix=self.prefix,
                             security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                             sasl_username=user, sasl_password=PLAIN_USERS[user],
                             ssl_cafile=str(self.ca.cert_path))

    def mtls(self, cert: Issued | None = None, **kw: Any) -> KafkaSettings:
        cert = cert or self.worker_cert
        fields: dict[str, Any] = {
            "bootstrap": f"127.0.0.1:{self.ssl_port}", "prefix": self.prefix,
            "security_protocol": "SSL", "ssl_cafile": str(self.ca.cert_path),
            "ssl_certfile": str(cert.cert), "ssl_keyfile": str(cert.key), **kw}
        return KafkaSettings(**fields)


def _grant_acls(admin: AdminClient, bindings: list[Any]) -> None:
    for future in admin.create_acls(bindings).values():
        future.result(timeout=30)


def _matrix_acls(principal: str) -> list[Any]:
    from schemas.kafka_clients import (
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    return [AclBinding(kind, MATRIX, ResourcePatternType.PREFIXED, principal, "*",
                       AclOperation.ALL, AclPermissionType.ALLOW)
            for kind in (ResourceType.TOPIC, ResourceType.GROUP)]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    localkafka.fetch_jars()
    tmp = tmp_path_factory.mktemp("secured")
    ca = TestCA(tmp / "pki")
    broker = ca.issue("broker", server=True)
    rogue = TestCA(tmp / "rogue-pki", name="someone else's CA").issue("worker", server=False)
    ports = [localkafka.free_port() for _ in range(3)]
    listeners = localkafka.SecuredListeners(
        ssl_port=ports[1], sasl_ssl_port=ports[2], keystore=ca.keystore(broker),
        truststore=ca.cert_path, scram_users=PASSWORDS, plain_users=PLAIN_USERS)
    data_dir = tmp / "kafka"
    localkafka.up(port=ports[0], data_dir=data_dir, secured=listeners)
    try:
        env = Secured(tmp=tmp, ca=ca, port=ports[0], ssl_port=ports[1], sasl_port=ports[2],
                      worker_cert=ca.issue("worker", server=False), rogue_cert=rogue,
                      prefix=f"s{uuid.uuid4().hex[:6]}.")
        admin = env.operator_admin()
        principals = {"operator": "User:operator", "control-plane": "User:control",
                      "worker": "User:worker", "client": "User:client",
                      "scheduler": "User:scheduler"}
        bindings = [b for component, principal in principals.items()
                    for b in acls.bindings(component, principal, env.prefix)]  # type: ignore[arg-type]
        bindings += [b for p in principals.values() for b in _matrix_acls(p)]
        _grant_acls(admin, bindings)
        yield env
    finally:
        localkafka.down(data_dir)


# -- every protocol, both client libraries -------------------------------------------------------

CASES = {
    "mtls": lambda s: s.mtls(),
    "scram-sha-256": lambda s: s.scram("control", "SCRAM-SHA-256"),
    "scram-sha-512": lambda s: s.scram("control", "SCRAM-SHA-512"),
    "plain": lambda s: s.plain("scheduler"),
}


def _round_trip_confluent(settings: KafkaSettings, topic: str) -> bytes:
    producer = kafka_clients.producer(settings, **{"linger.ms": 0})
    producer.produce(topic, key=b"k", value=b"via-librdkafka")
    assert producer.flush(20) == 0
    consumer = kafka_clients.consumer(settings, f"{MATRIX}{uuid.uuid4().hex[:6]}",
                                      **{"auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            value = msg.value() if msg is not None and msg.error() is None else None
            if value is not None:
                return bytes(value)
        raise AssertionError(f"nothing read back from {topic}")
    finally:
        consumer.close()


async def _round_trip_aiokafka(settings: KafkaSettings, topic: str) -> bytes:
    """Through the exact credentials Faust builds for the control plane (`broker_kwargs`)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from streams.app import broker_kwargs

    auth = credentials_to_aiokafka_auth(broker_kwargs(settings).get("broker_credentials"))
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap, **auth)
    await producer.start()
    try:
        await producer.send_and_wait(topic, key=b"k", value=b"via-aiokafka")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=settings.bootstrap,
                                group_id=f"{MATRIX}{uuid.uuid4().hex[:6]}",
                                auto_offset_reset="earliest", **auth)
    await consumer.start()
    try:
        msg = await asyncio.wait_for(consumer.getone(), timeout=30)
        return bytes(msg.value)
    finally:
        await consumer.stop()


@pytest.mark.parametrize("case", sorted(CASES))
async def test_each_protocol_works_for_both_kafka_client_libraries(secured: Secured,
                                                                   case: str) -> None:
    settings = CASES[case](secured)
    topics = [f"{MATRIX}{case}.{lib}.{uuid.uuid4().hex[:6]}" for lib in ("rd", "aio")]
    admin = secured.operator_admin()
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
        future.result(timeout=30)
    assert await asyncio.to_thread(_round_trip_confluent, settings, topics[0]) \
        == b"via-librdkafka"
    assert await _round_trip_aiokafka(settings, topics[1]) == b"via-aiokafka"


# -- the product end to end, least privilege ------------------------------------------------------


def _post_rank(url: str) -> dict[str, Any]:
    import json

    request = urllib.request.Request(url + "/v1/rank", data=body(4, 8),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        result: dict[str, Any] = json.load(resp)
        return result


def test_control_plane_worker_and_client_over_tls_and_sasl_with_least_privilege(
        secured: Secured, tmp_path: Path) -> None:
    operator = secured.scram("operator")
    report = apply_topics(operator.confluent(), operator.prefix, partitions_override=2)
    assert report.ok, report.mismatches
    key_file = tmp_path / "targets.key"
    key_file.write_text(uuid.uuid4().hex)
    started = time.monotonic()
    control = ControlProc(tmp_path, "cp", secured.scram("control"), app_id=acls.DEFAULT_APP_ID,
                          config=control_toml(tmp_path, min_samples=5),
                          env=kafka_env(secured.scram("control")), flags=False,
                          args=["--signing-key-file", str(key_file)])
    worker = WorkerProc(tmp_path, "w1", tier="baseline", env=kafka_env(secured.mtls()),
                        args=["--signing-key-file", str(key_file)])
    try:
        worker.wait_ready()
        grant(secured.plain("scheduler"), RMA_POOL, key=key_file.read_bytes())
        served_optional = 0
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and served_optional == 0:
            assert control.alive(), control.output()[-3000:]
            served_optional = _post_rank(worker.url)["optional_scored"]
            time.sleep(0.05)
        samples = worker.metrics()
        print(f"secured: first optional work {time.monotonic() - started:.1f}s after start; "
              f"worker verdicts applied="
              f"{metric(samples, 'surplus_worker_target_verdicts_total', verdict='applied')}")
        assert served_optional > 0, (control.output()[-3000:], worker.output()[-3000:])
        assert metric(samples, "surplus_worker_target_verdicts_total", verdict="applied") >= 1
        assert metric(samples, "surplus_worker_window_reports_total", outcome="published") >= 1

        load = LoadRunner(baseline_urls=[worker.url], kafka=secured.scram(
            "client", "SCRAM-SHA-256"), rate_rps=20, signing_key=key_file.read_bytes()).start()
        time.sleep(4)
        load.stop()
        summary = load.client_summary()
        print(f"secured client: {summary['targets']} outcomes {summary['decisions']['outcomes']}")
        assert summary["targets"].get("applied", 0) >= 1
        assert summary["decisions"]["outcomes"].get("published", 0) >= 1
        assert not summary["feed_failed"]

        reader = TopicReader(secured.super_user(), "targets")
        reader.poll(2.0)
        published = reader.events(ControlTargets)
        reader.close()
        assert published and all(verifier(key_file.read_bytes())(t) is None for t in published)
    finally:
        for proc in (worker, control):
            proc.stop()
    for proc in (control, worker):  # the documented ACLs were enough: nothing was refused
        assert "Traceback" not in proc.output(), proc.output()[-3000:]
        assert "AUTHORIZATION" not in proc.output().upper(), proc.output()[-3000:]
    assert not [k for k in summary["feed"] if k.startswith("kafka_error")], summary["feed"]


@pytest.mark.parametrize("who", ["worker", "scheduler", "client"])
def test_no_principal_but_the_control_plane_may_write_targets(secured: Secured,
                                                              who: str) -> None:
    settings = {"worker": secured.mtls(), "scheduler": secured.plain("scheduler"),
                "client": secured.scram("client", "SCRAM-SHA-256")}[who]
    errors: list[KafkaError | None] = []
    producer = kafka_clients.producer(settings, **{"linger.ms": 0, "message.timeout.ms": 10_000})
    producer.produce(settings.topic("targets"), key=b"eu1", value=b"{}",
                     on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(15)
    assert errors and errors[0] is not None
    assert errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors[0]


# -- bad credentials and bad TLS stop a component at start ---------------------------------------


def _surplus(args: list[str], env: dict[str, str], timeout_s: float = 90) -> tuple[int, str,
                                                                                  float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SURPLUS_")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "surplus.cli", *args], env={**clean, **env},
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    return proc.returncode, proc.stderr, time.monotonic() - started


def test_wrong_credentials_or_certificates_stop_components_at_start_in_one_line(
        secured: Secured, tmp_path: Path) -> None:
    worker_toml = tmp_path / "w.toml"
    worker_toml.write_text('worker_id = "w-bad"\n[model]\ndevice = "cpu"\nthreads = 1\n')
    control = ["control-plane", "--data-dir", str(tmp_path / "state")]
    worker = ["worker", "--config", str(worker_toml), "--port", "0"]
    cases = [
        (control, secured.scram("control", sasl_password=WRONG),
         ["SCRAM-SHA-512 user 'control'", "Authentication failed", "sasl_password"]),
        (worker, KafkaSettings(bootstrap=f"127.0.0.1:{secured.sasl_port}",
                               security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                               sasl_username="scheduler", sasl_password=WRONG,
                               ssl_cafile=str(secured.ca.cert_path)),
         ["PLAIN user 'scheduler'", "sasl_password"]),
        (worker, secured.mtls(secured.rogue_cert),
         ["refused the client certificate", "ssl_certfile"]),
        (control, secured.scram("control", ssl_cafile=None),
         ["certificate verify failed", "ssl_cafile"]),
    ]
    for args, settings, expected in cases:
        rc, err, seconds = _surplus(args, kafka_env(settings))
        print(f"{args[0]} with {settings.security_protocol} {settings.sasl_mechanism or 'mTLS'}"
              f": exit {rc} after {seconds:.1f}s: {err.strip()}")
        assert rc == 1, err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
        for fragment in expected:
            assert fragment in err, (fragment, err)
        assert WRONG not in err and PASSWORDS["control"] not in err  # secrets stay secret

    env = kafka_env(secured.mtls()) | {"SURPLUS_KAFKA_SSL_CAFILE": str(tmp_path / "absent.pem")}
    rc, err, _ = _surplus(control, env)
    assert rc == 1 and "ssl_cafile" in err and "does not exist" in err, err
    assert len(err.strip().splitlines()) == 1, err
