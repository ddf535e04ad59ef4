"""One local broker: start it (`up`), ask whether it runs (`status`) and serves
(`serves_metadata`), and stop it (`down`); its pid and port are recorded in its data dir."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from surplus.localkafka.jvm import (
    DEFAULT_DATA,
    DEFAULT_PORT,
    INFRA_DIR,
    START_TIMEOUT_S,
    BrokerError,
    classpath,
    format_command,
    java_binary,
    log_cause,
    new_cluster_id,
    node_dirs,
    pid_alive,
    read_state,
    start_jvm,
    terminate,
)
from surplus.localkafka.listeners import BehindProxy, SecuredListeners
from surplus.localkafka.ports import port_free


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
    state = read_state(data_dir)
    if state is None or not pid_alive(state[0]):
        return None
    return BrokerInfo(pid=state[0], port=state[1], data_dir=data_dir)


def write_config(data_dir: Path, port: int, controller_port: int,
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
    proc = subprocess.run(format_command(java, config, cluster_id or new_cluster_id(),
                                          extra_args),
                          capture_output=True, text=True, check=False, timeout=120)
    if proc.returncode != 0:
        lines = (proc.stdout + proc.stderr).strip().splitlines() or ["no output"]
        raise BrokerError(f"formatting KRaft storage failed: {lines[-1]}")


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
    if node_dirs(data_dir):
        raise BrokerError(f"{data_dir} holds a local cluster: use --brokers "
                          f"{len(node_dirs(data_dir))}, or another --data-dir")
    running = status(data_dir)
    if running is not None:
        return running, False
    java = java_binary()
    classpath()
    controller_port = port + 1
    for p in (port, controller_port, *(listeners.ports() if listeners else ())):
        if not port_free(p):
            raise BrokerError(f"port {p} on 127.0.0.1 is already in use")
    data_dir.mkdir(parents=True, exist_ok=True)
    config = write_config(data_dir, port, controller_port, listeners)
    _format_storage(java, config, data_dir, secured.format_args() if secured else None)
    started = time.monotonic()
    proc = start_jvm(java, config, data_dir, port, heap_mb)
    info = BrokerInfo(pid=proc.pid, port=port, data_dir=data_dir)
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            (data_dir / "broker.pid").unlink(missing_ok=True)
            raise BrokerError(f"broker exited during start (code {proc.returncode}): "
                              f"{log_cause(data_dir)}")
        if serves_metadata(info.bootstrap, timeout_s=1.0):
            return BrokerInfo(proc.pid, port, data_dir, time.monotonic() - started), True
        time.sleep(0.2)
    terminate(proc.pid)
    (data_dir / "broker.pid").unlink(missing_ok=True)
    raise BrokerError(f"broker did not serve metadata within {timeout_s:.0f}s: "
                      f"{log_cause(data_dir)}")


def down(data_dir: Path = DEFAULT_DATA) -> BrokerInfo | None:
    """Stop the broker recorded in `data_dir`; returns what was stopped, or None."""
    data_dir = data_dir.resolve()
    running = status(data_dir)
    if running is not None:
        terminate(running.pid)
    (data_dir / "broker.pid").unlink(missing_ok=True)
    return running
