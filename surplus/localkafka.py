"""The embedded local Kafka broker: a real Apache Kafka (KRaft) from Maven jars.

Docker is not everywhere; Java and Maven Central are. `surplus kafka up` runs the same broker
that production uses, on 127.0.0.1, so tests, the demo and a new user's first try all talk to
real Kafka. Every failure mode ends in `BrokerError` with a one-line reason, never a hang.

One node by default. `up_cluster` runs several (`surplus kafka up --brokers 3`), each broker
and KRaft controller, replicated as production is (`schemas.topics.replication_for`), so that a
broker can be killed under load: node *i* (from 1) listens on ``port + 2(i-1)`` and its
controller on the port after, and keeps its state in ``data_dir/node-i`` laid out as a
single broker's data dir.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from schemas.topics import min_insync_for, replication_for

REPO_ROOT = Path(__file__).resolve().parents[1]
INFRA_DIR = REPO_ROOT / "infra" / "kafka"
DEFAULT_LIBS = REPO_ROOT / ".kafka" / "libs"
DEFAULT_DATA = REPO_ROOT / ".kafka" / "data"
DEFAULT_PORT = 9092
BROKER_GC = ("-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20")
"""The collector Kafka's own start script uses. Every produce and fetch, preemption notices'
included, waits out a stop-the-world pause: in six 40 s demos each here, the longest pause
was 18-28 ms with these and 35-102 ms with the serial collector used before."""
GC_LOG = "gc.log"
"""The broker JVM's collector log in its data directory (``-Xlog:gc``, wall-clock stamps)."""
_GC_PAUSE = re.compile(r"^\[(?P<at>\d+)ms\] GC\(\d+\) Pause .* (?P<ms>\d+(?:\.\d+)?)ms$",
                       re.MULTILINE)
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
#: Several JVMs start at once on a small machine: each gets a smaller heap and more time.
CLUSTER_HEAP_MB = 384
CLUSTER_START_TIMEOUT_S = 180.0
MAX_BROKERS = 9
# Ports picked for tests start here (below the ephemeral range, above the common services).
PRIVATE_PORT_LOW = 20000


class BrokerError(RuntimeError):
    """A broker could not be fetched, started, queried or stopped; the message says why."""


@dataclass(frozen=True)
class BrokerInfo:
    """What `up` and `status` report about a running local broker."""

    pid: int
    port: int
    data_dir: Path
    started_in_s: float | None = None
    node_id: int = 1

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass(frozen=True)
class ClusterInfo:
    """What `up_cluster` and `cluster_status` report: the nodes running, and those recorded
    in the data dir that are not (a node killed, or one that failed)."""

    nodes: tuple[BrokerInfo, ...]
    data_dir: Path
    missing: tuple[int, ...] = ()
    started_in_s: float | None = None

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def node(self, node_id: int) -> BrokerInfo:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise BrokerError(f"node {node_id} is not running in {self.data_dir}")


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


def kafka_version() -> str:
    """The Kafka release every Surplus broker runs: the pom's ``kafka.version`` (the embedded
    broker's jars). docker-compose.yml and the test containers' image use the same tag, and a
    test holds them to it, so no path tests against one Kafka and deploys another."""
    import xml.etree.ElementTree as ET

    pom = INFRA_DIR / "pom.xml"
    node = ET.parse(pom).getroot().find(
        "m:properties/m:kafka.version", {"m": "http://maven.apache.org/POM/4.0.0"})
    if node is None or not (node.text or "").strip():
        raise BrokerError(f"{pom} sets no kafka.version")
    return (node.text or "").strip()


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


def _ephemeral_low() -> int:
    """The first port the kernel hands out as a client's source port (32768 where unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free now, below the ephemeral range (for tests that need a broker of their own).

    A port the OS picks with ``bind(0)`` is an ephemeral one, and any client's outgoing
    connection may be given it as its source port before the broker binds it (a node then
    fails to start with "Address already in use"); below the range only a listener can take it.
    """
    return free_port_block(1)


def free_port_block(count: int, attempts: int = 200) -> int:
    """The first of ``count`` consecutive ports free now, below the ephemeral range."""
    high = _ephemeral_low() - count
    for _ in range(attempts):
        base = random.randrange(PRIVATE_PORT_LOW, high)
        if all(_port_free(base + i) for i in range(count)):
            return base
    raise BrokerError(f"no {count} consecutive free ports on 127.0.0.1 in "
                      f"{PRIVATE_PORT_LOW}-{high + count}")


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
    return brokers_seen(bootstrap, timeout_s) > 0


def brokers_seen(bootstrap: str, timeout_s: float = 2.0) -> int:
    """Brokers in the metadata that ``bootstrap`` answers with (0 when it does not answer):
    a cluster is up once each node's answer lists them all."""
    from schemas import kafka_clients

    admin = kafka_clients.admin({
        "bootstrap.servers": bootstrap, "socket.timeout.ms": 1000, "log_level": 0,
        "logger": kafka_clients.silent_logger("surplus.localkafka.librdkafka")})
    try:
        meta = admin.list_topics(timeout=timeout_s)
    except Exception:
        return 0
    return len(meta.brokers)


def status(data_dir: Path = DEFAULT_DATA) -> BrokerInfo | None:
    """The running broker recorded in `data_dir`, or None when none runs there."""
    state = _read_state(data_dir)
    if state is None or not _pid_alive(state[0]):
        return None
    return BrokerInfo(pid=state[0], port=state[1], data_dir=data_dir)


def _write_config(data_dir: Path, port: int, controller_port: int,
                  listeners: SecuredListeners | BehindProxy | None = None) -> Path:
    template = (INFRA_DIR / "server.properties.template").read_text()
    config = template.format(port=port, controller_port=controller_port,
                             log_dir=data_dir / "logs")
    if listeners is not None:
        config += "\n" + listeners.properties(port, controller_port)
    path = data_dir / "server.properties"
    path.write_text(config)
    return path


def _format_storage(java: str, config: Path, data_dir: Path,
                    extra_args: list[str] | None = None, cluster_id: str | None = None) -> None:
    if (data_dir / "logs" / "meta.properties").exists():
        return
    proc = subprocess.run(_format_command(java, config, cluster_id or _new_cluster_id(),
                                          extra_args),
                          capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        lines = (proc.stdout + proc.stderr).strip().splitlines() or ["no output"]
        raise BrokerError(f"formatting KRaft storage failed: {lines[-1]}")


def _new_cluster_id() -> str:
    return uuid.uuid4().hex[:22]


def _format_command(java: str, config: Path, cluster_id: str,
                    extra_args: list[str] | None = None) -> list[str]:
    return [java, "-cp", _classpath(), *_log_flags(), "kafka.tools.StorageTool", "format",
            "-t", cluster_id, "-c", str(config), "--ignore-formatted", *(extra_args or [])]


def _log_flags() -> list[str]:
    return [f"-Dlog4j2.configurationFile={INFRA_DIR / 'log4j2.properties'}"]


def up(port: int = DEFAULT_PORT, data_dir: Path = DEFAULT_DATA,
       heap_mb: int = 512, timeout_s: float = START_TIMEOUT_S,
       secured: SecuredListeners | None = None,
       behind_proxy: BehindProxy | None = None) -> tuple[BrokerInfo, bool]:
    """Start the broker in the background; returns (info, started) — started=False if it ran.

    With ``secured``, it also listens with TLS and SASL (see `SecuredListeners`); ``port``
    stays the PLAINTEXT operator listener, which readiness is checked on. With
    ``behind_proxy``, clients are sent to the proxy (see `BehindProxy`); readiness is still
    checked on ``port`` itself.
    """
    if secured is not None and behind_proxy is not None:
        raise BrokerError("a local broker is either secured or behind a proxy, not both")
    listeners = secured or behind_proxy
    data_dir = data_dir.resolve()
    if _node_dirs(data_dir):
        raise BrokerError(f"{data_dir} holds a local cluster: use --brokers "
                          f"{len(_node_dirs(data_dir))}, or another --data-dir")
    running = status(data_dir)
    if running is not None:
        return running, False
    java = java_binary()
    _classpath()
    controller_port = port + 1
    for p in (port, controller_port, *(listeners.ports() if listeners else ())):
        if not _port_free(p):
            raise BrokerError(f"port {p} on 127.0.0.1 is already in use")
    data_dir.mkdir(parents=True, exist_ok=True)
    config = _write_config(data_dir, port, controller_port, listeners)
    _format_storage(java, config, data_dir, secured.format_args() if secured else None)
    started = time.monotonic()
    proc = _start_jvm(java, config, data_dir, port, heap_mb)
    info = BrokerInfo(pid=proc.pid, port=port, data_dir=data_dir)
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            (data_dir / "broker.pid").unlink(missing_ok=True)
            raise BrokerError(f"broker exited during start (code {proc.returncode}): "
                              f"{_log_cause(data_dir)}")
        if serves_metadata(info.bootstrap, timeout_s=1.0):
            return BrokerInfo(proc.pid, port, data_dir, time.monotonic() - started), True
        time.sleep(0.2)
    _terminate(proc.pid)
    (data_dir / "broker.pid").unlink(missing_ok=True)
    raise BrokerError(f"broker did not serve metadata within {timeout_s:.0f}s: "
                      f"{_log_cause(data_dir)}")


def _start_jvm(java: str, config: Path, data_dir: Path, port: int,
               heap_mb: int) -> subprocess.Popen[bytes]:
    """One broker JVM in a session of its own, its pid and port recorded in ``data_dir``."""
    log = (data_dir / "broker.log").open("ab")
    proc = subprocess.Popen(
        [java, f"-Xms{heap_mb // 2}m", f"-Xmx{heap_mb}m", *BROKER_GC,
         f"-Xlog:gc:file={data_dir / GC_LOG}:timemillis",
         "-Djava.awt.headless=true", *_log_flags(), "-cp", _classpath(), "kafka.Kafka",
         str(config)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    (data_dir / "broker.pid").write_text(f"{proc.pid} {port}\n")
    return proc


def gc_pauses(text: str) -> list[tuple[int, float]]:
    """The stop-the-world pauses in a broker's ``GC_LOG``: (wall-clock ms, pause ms) each.

    A pause stops every produce and fetch on the broker, a preemption notice's included: with
    the log, a run can tell a notice delayed by the broker from one delayed elsewhere."""
    return [(int(m["at"]), float(m["ms"])) for m in _GC_PAUSE.finditer(text)]


def _log_cause(data_dir: Path) -> str:
    try:
        lines = (data_dir / "broker.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no broker log"
    errors = [ln for ln in lines if " ERROR " in ln or "Exception" in ln]
    if errors:
        # The first error is the cause; what follows is often the shutdown it set off.
        return errors[0][:300] + (f" (then: {errors[-1][:200]})" if len(errors) > 1 else "")
    return (lines or ["empty broker log"])[-1][:300]


def _terminate(*pids: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to each process group at once (the nodes of a cluster shut down together, so
    none waits on a quorum already gone), SIGKILL to those still there after ``timeout_s``."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        for pid in alive:
            _reap(pid)
        alive = [pid for pid in alive if _pid_alive(pid)]
        if alive:
            time.sleep(0.1)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
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


# -- a cluster of local nodes ---------------------------------------------------------------------

def is_cluster(data_dir: Path) -> bool:
    """True when ``data_dir`` holds the nodes of a cluster rather than a single broker."""
    return bool(_node_dirs(data_dir.resolve()))


def _node_dirs(data_dir: Path) -> list[Path]:
    if not data_dir.is_dir():
        return []
    return sorted((p for p in data_dir.glob("node-*") if p.is_dir() and p.name[5:].isdigit()),
                  key=lambda p: int(p.name[5:]))


def _node_ports(port: int, node_id: int) -> tuple[int, int]:
    """Client and controller port of node ``node_id`` (from 1) of a cluster based at ``port``."""
    client = port + 2 * (node_id - 1)
    return client, client + 1


def cluster_status(data_dir: Path = DEFAULT_DATA) -> ClusterInfo | None:
    """The cluster recorded in ``data_dir``, or None when none of its nodes runs."""
    data_dir = data_dir.resolve()
    nodes, missing = [], []
    for node_dir in _node_dirs(data_dir):
        node_id = int(node_dir.name[5:])
        info = status(node_dir)
        if info is None:
            missing.append(node_id)
        else:
            nodes.append(BrokerInfo(info.pid, info.port, node_dir, node_id=node_id))
    if not nodes:
        return None
    return ClusterInfo(tuple(nodes), data_dir, tuple(missing))


def _cluster_config(node_dir: Path, node_id: int, port: int, brokers: int) -> Path:
    client, controller = _node_ports(port, node_id)
    voters = ",".join(f"{i}@127.0.0.1:{_node_ports(port, i)[1]}" for i in range(1, brokers + 1))
    replication = replication_for(brokers)
    template = (INFRA_DIR / "cluster.properties.template").read_text()
    config = template.format(node_id=node_id, port=client, controller_port=controller,
                             voters=voters, log_dir=node_dir / "logs",
                             replication_factor=replication,
                             min_insync=min_insync_for(replication))
    path = node_dir / "server.properties"
    path.write_text(config)
    return path


def _recorded_cluster_id(data_dir: Path) -> str | None:
    """The cluster id a node of ``data_dir`` was formatted with (the others must share it)."""
    for node_dir in _node_dirs(data_dir):
        meta = node_dir / "logs" / "meta.properties"
        if meta.exists():
            for line in meta.read_text().splitlines():
                if line.startswith("cluster.id="):
                    return line.split("=", 1)[1].strip()
    return None


def _format_nodes(java: str, configs: dict[Path, Path], cluster_id: str) -> None:
    """Format the nodes not formatted yet, in parallel (each is a JVM start)."""
    procs = {node_dir: subprocess.Popen(_format_command(java, config, cluster_id),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for node_dir, config in configs.items()
             if not (node_dir / "logs" / "meta.properties").exists()}
    for node_dir, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            lines = out.decode(errors="replace").strip().splitlines() or ["no output"]
            raise BrokerError(f"formatting KRaft storage of {node_dir.name} failed: {lines[-1]}")


def up_cluster(brokers: int = 3, port: int = DEFAULT_PORT, data_dir: Path = DEFAULT_DATA,
               heap_mb: int = CLUSTER_HEAP_MB, timeout_s: float = CLUSTER_START_TIMEOUT_S
               ) -> tuple[ClusterInfo, bool]:
    """Start ``brokers`` nodes (those of ``data_dir`` not running: a node killed comes back
    with its data) and wait until each serves metadata naming them all; returns (info,
    started), started=False when every node ran already."""
    if not 1 <= brokers <= MAX_BROKERS:
        raise BrokerError(f"brokers must be 1 to {MAX_BROKERS}, not {brokers}")
    data_dir = data_dir.resolve()
    if (data_dir / "broker.pid").exists() or (data_dir / "logs").exists():
        raise BrokerError(f"{data_dir} holds a single broker: drop --brokers, or use another "
                          f"--data-dir")
    recorded = len(_node_dirs(data_dir))
    if recorded and recorded != brokers:
        raise BrokerError(f"{data_dir} holds a cluster of {recorded}, not of {brokers} brokers")
    running = cluster_status(data_dir)
    if running is not None and not running.missing:
        return running, False
    java = java_binary()
    _classpath()
    alive = {n.node_id for n in running.nodes} if running else set()
    to_start = [i for i in range(1, brokers + 1) if i not in alive]
    for node_id in to_start:
        for p in _node_ports(port, node_id):
            if not _port_free(p):
                raise BrokerError(f"port {p} on 127.0.0.1 is already in use")
    configs = {}
    for node_id in to_start:
        node_dir = data_dir / f"node-{node_id}"
        node_dir.mkdir(parents=True, exist_ok=True)
        configs[node_dir] = _cluster_config(node_dir, node_id, port, brokers)
    _format_nodes(java, configs, _recorded_cluster_id(data_dir) or _new_cluster_id())
    started = time.monotonic()
    procs = {int(node_dir.name[5:]): _start_jvm(java, config, node_dir,
                                                _node_ports(port, int(node_dir.name[5:]))[0],
                                                heap_mb)
             for node_dir, config in configs.items()}
    try:
        _wait_cluster(procs, data_dir, port, brokers, timeout_s)
    except BrokerError:
        _terminate(*(proc.pid for proc in procs.values()))
        for node_id in procs:
            (data_dir / f"node-{node_id}" / "broker.pid").unlink(missing_ok=True)
        raise
    info = cluster_status(data_dir)
    assert info is not None
    return ClusterInfo(info.nodes, data_dir, info.missing, time.monotonic() - started), True


def _wait_cluster(procs: dict[int, subprocess.Popen[bytes]], data_dir: Path, port: int,
                  brokers: int, timeout_s: float) -> None:
    """Until every node answers metadata listing all ``brokers``; a node that exits or the
    timeout passed raises, naming the node and its last log line."""
    deadline = time.monotonic() + timeout_s
    waiting = set(range(1, brokers + 1))
    while time.monotonic() < deadline:
        for node_id, proc in procs.items():
            if proc.poll() is not None:
                raise BrokerError(f"node {node_id} exited during start (code {proc.returncode}): "
                                  f"{_log_cause(data_dir / f'node-{node_id}')}")
        for node_id in sorted(waiting):
            client, _ = _node_ports(port, node_id)
            if brokers_seen(f"127.0.0.1:{client}", timeout_s=1.0) >= brokers:
                waiting.discard(node_id)
        if not waiting:
            return
        time.sleep(0.2)
    node_id = min(waiting)
    raise BrokerError(f"node {node_id} did not serve metadata of {brokers} brokers within "
                      f"{timeout_s:.0f}s: "
                      f"{_log_cause(data_dir / f'node-{node_id}')}")


def down_cluster(data_dir: Path = DEFAULT_DATA) -> ClusterInfo | None:
    """Stop every node recorded in ``data_dir`` together; returns what was running, or None."""
    data_dir = data_dir.resolve()
    running = cluster_status(data_dir)
    if running is not None:
        _terminate(*(node.pid for node in running.nodes))
    for node_dir in _node_dirs(data_dir):
        (node_dir / "broker.pid").unlink(missing_ok=True)
    return running


def rss_mb(pid: int) -> float:
    """Resident memory of a process in MiB (for the broker footprint in notes and status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
