"""The embedded local Kafka broker: a real Apache Kafka (KRaft, single node) from Maven jars.

Docker is not everywhere; Java and Maven Central are. `surplus kafka up` runs the same broker
that production uses, on 127.0.0.1, so tests, the demo and a new user's first try all talk to
real Kafka. Every failure mode ends in `BrokerError` with a one-line reason, never a hang.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
INFRA_DIR = REPO_ROOT / "infra" / "kafka"
DEFAULT_LIBS = REPO_ROOT / ".kafka" / "libs"
DEFAULT_DATA = REPO_ROOT / ".kafka" / "data"
DEFAULT_PORT = 9092
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


class BrokerError(RuntimeError):
    """A broker could not be fetched, started, queried or stopped; the message says why."""


@dataclass(frozen=True)
class BrokerInfo:
    """What `up` and `status` report about a running local broker."""

    pid: int
    port: int
    data_dir: Path
    started_in_s: float | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


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


_SAFE_CREDENTIAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._")


def libs_dir() -> Path:
    return Path(os.environ.get("SURPLUS_KAFKA_LIBS", DEFAULT_LIBS))


def java_binary() -> str:
    """The Java launcher: $JAVA_HOME/bin/java if set, else `java` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise BrokerError("java not found: install Java 17+ or set JAVA_HOME")
    return found


def fetch_jars(quiet: bool = True) -> Path:
    """Resolve the Kafka broker jars from Maven Central into `.kafka/libs` (no-op if present)."""
    target = libs_dir()
    if _has_kafka_jars(target):
        return target
    mvn = shutil.which("mvn")
    if not mvn:
        raise BrokerError("mvn not found: install Maven, or put the Kafka jars in " + str(target))
    cmd = [mvn, "-B", "-f", str(INFRA_DIR / "pom.xml"), "dependency:copy-dependencies",
           f"-Dlibs.dir={target}"]
    if quiet:
        cmd.insert(1, "-q")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not _has_kafka_jars(target):
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
        raise BrokerError(f"could not fetch Kafka jars with Maven: {tail[0]}")
    return target


def _has_kafka_jars(path: Path) -> bool:
    return path.is_dir() and any(path.glob("kafka_2.13-*.jar"))


def _classpath() -> str:
    libs = libs_dir()
    if not _has_kafka_jars(libs):
        raise BrokerError(f"Kafka jars missing in {libs}: run `surplus kafka fetch`")
    return str(libs / "*")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port the OS says is free now (for tests that need a broker of their own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as dead.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _read_state(data_dir: Path) -> tuple[int, int] | None:
    state = data_dir / "broker.pid"
    if not state.exists():
        return None
    try:
        pid_s, port_s = state.read_text().split()
        return int(pid_s), int(port_s)
    except ValueError:
        return None


def serves_metadata(bootstrap: str, timeout_s: float = 2.0) -> bool:
    """True when the broker answers a metadata request (an open port is not enough)."""
    from schemas import kafka_clients

    admin = kafka_clients.admin({
        "bootstrap.servers": bootstrap, "socket.timeout.ms": 1000, "log_level": 0,
        "logger": kafka_clients.silent_logger("surplus.localkafka.librdkafka")})
    try:
        meta = admin.list_topics(timeout=timeout_s)
    except Exception:
        return False
    return bool(meta.brokers)


def status(data_dir: Path = DEFAULT_DATA) -> BrokerInfo | None:
    """The running broker recorded in `data_dir`, or None when none runs there."""
    state = _read_state(data_dir)
    if state is None or not _pid_alive(state[0]):
        return None
    return BrokerInfo(pid=state[0], port=state[1], data_dir=data_dir)


def _write_config(data_dir: Path, port: int, controller_port: int,
                  secured: SecuredListeners | None = None) -> Path:
    template = (INFRA_DIR / "server.properties.template").read_text()
    config = template.format(port=port, controller_port=controller_port,
                             log_dir=data_dir / "logs")
    if secured is not None:
        config += "\n" + secured.properties(port, controller_port)
    path = data_dir / "server.properties"
    path.write_text(config)
    return path


def _format_storage(java: str, config: Path, data_dir: Path,
                    extra_args: list[str] | None = None) -> None:
    if (data_dir / "logs" / "meta.properties").exists():
        return
    cluster_id = uuid.uuid4().hex[:22]
    proc = subprocess.run(
        [java, "-cp", _classpath(), *_log_flags(), "kafka.tools.StorageTool", "format",
         "-t", cluster_id, "-c", str(config), "--ignore-formatted", *(extra_args or [])],
        capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        lines = (proc.stdout + proc.stderr).strip().splitlines() or ["no output"]
        raise BrokerError(f"formatting KRaft storage failed: {lines[-1]}")


def _log_flags() -> list[str]:
    return [f"-Dlog4j2.configurationFile={INFRA_DIR / 'log4j2.properties'}"]


def up(port: int = DEFAULT_PORT, data_dir: Path = DEFAULT_DATA,
       heap_mb: int = 512, timeout_s: float = START_TIMEOUT_S,
       secured: SecuredListeners | None = None) -> tuple[BrokerInfo, bool]:
    """Start the broker in the background; returns (info, started) — started=False if it ran.

    With ``secured``, it also listens with TLS and SASL (see `SecuredListeners`); ``port``
    stays the PLAINTEXT operator listener, which readiness is checked on.
    """
    data_dir = data_dir.resolve()
    running = status(data_dir)
    if running is not None:
        return running, False
    java = java_binary()
    _classpath()
    controller_port = port + 1
    for p in (port, controller_port, *(secured.ports() if secured else ())):
        if not _port_free(p):
            raise BrokerError(f"port {p} on 127.0.0.1 is already in use")
    data_dir.mkdir(parents=True, exist_ok=True)
    config = _write_config(data_dir, port, controller_port, secured)
    _format_storage(java, config, data_dir, secured.format_args() if secured else None)
    log = (data_dir / "broker.log").open("ab")
    started = time.monotonic()
    proc = subprocess.Popen(
        [java, f"-Xms{heap_mb // 2}m", f"-Xmx{heap_mb}m", "-XX:+UseSerialGC",
         "-Djava.awt.headless=true", *_log_flags(), "-cp", _classpath(), "kafka.Kafka",
         str(config)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    (data_dir / "broker.pid").write_text(f"{proc.pid} {port}\n")
    info = BrokerInfo(pid=proc.pid, port=port, data_dir=data_dir)
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            (data_dir / "broker.pid").unlink(missing_ok=True)
            raise BrokerError(f"broker exited during start (code {proc.returncode}): "
                              f"{_last_log_line(data_dir)}")
        if serves_metadata(info.bootstrap, timeout_s=1.0):
            return BrokerInfo(proc.pid, port, data_dir, time.monotonic() - started), True
        time.sleep(0.2)
    _terminate(proc.pid)
    (data_dir / "broker.pid").unlink(missing_ok=True)
    raise BrokerError(f"broker did not serve metadata within {timeout_s:.0f}s: "
                      f"{_last_log_line(data_dir)}")


def _last_log_line(data_dir: Path) -> str:
    try:
        lines = (data_dir / "broker.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no broker log"
    errors = [ln for ln in lines if " ERROR " in ln or "Exception" in ln]
    return (errors or lines or ["empty broker log"])[-1][:300]


def _terminate(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not _pid_alive(pid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _reap(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def down(data_dir: Path = DEFAULT_DATA) -> BrokerInfo | None:
    """Stop the broker recorded in `data_dir`; returns what was stopped, or None."""
    data_dir = data_dir.resolve()
    running = status(data_dir)
    if running is not None:
        _terminate(running.pid)
    (data_dir / "broker.pid").unlink(missing_ok=True)
    return running


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MiB (for the broker footprint in notes and status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
