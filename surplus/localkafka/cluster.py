"""A cluster of local nodes (`up_cluster`, ``surplus kafka up --brokers 3``): each a broker
and KRaft controller, replicated as production is (`schemas.topics.replication_for`); node
*i* (from 1) listens on ``port + 2(i-1)``, its controller on the port after, and keeps its
state in ``data_dir/node-i`` laid out as a single broker's data dir."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from schemas.topics import min_insync_for, replication_for
from surplus.localkafka.broker import BrokerInfo, brokers_seen, status
from surplus.localkafka.jvm import (
    DEFAULT_DATA,
    DEFAULT_PORT,
    INFRA_DIR,
    BrokerError,
    classpath,
    format_command,
    java_binary,
    log_cause,
    new_cluster_id,
    node_dirs,
    start_jvm,
    terminate,
)
from surplus.localkafka.ports import port_free

#: Several JVMs start at once on a small machine: each gets a smaller heap and more time.
CLUSTER_HEAP_MB = 384


CLUSTER_START_TIMEOUT_S = 180.0


MAX_BROKERS = 9


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


def is_cluster(data_dir: Path) -> bool:
    """True when ``data_dir`` holds the nodes of a cluster rather than a single broker."""
    return bool(node_dirs(data_dir.resolve()))


def _node_ports(port: int, node_id: int) -> tuple[int, int]:
    """Client and controller port of node ``node_id`` (from 1) of a cluster based at ``port``."""
    client = port + 2 * (node_id - 1)
    return client, client + 1


def cluster_status(data_dir: Path = DEFAULT_DATA) -> ClusterInfo | None:
    """The cluster recorded in ``data_dir``, or None when none of its nodes runs."""
    data_dir = data_dir.resolve()
    nodes, missing = [], []
    for node_dir in node_dirs(data_dir):
        node_id = int(node_dir.name[5:])
        info = status(node_dir)
        if info is None:
            missing.append(node_id)
        else:
            nodes.append(BrokerInfo(info.pid, info.port, node_dir, node_id=node_id))
    if not nodes:
        return None
    return ClusterInfo(tuple(nodes), data_dir, tuple(missing))


def cluster_config(node_dir: Path, node_id: int, port: int, brokers: int) -> Path:
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
    for node_dir in node_dirs(data_dir):
        meta = node_dir / "logs" / "meta.properties"
        if meta.exists():
            for line in meta.read_text().splitlines():
                if line.startswith("cluster.id="):
                    return line.split("=", 1)[1].strip()
    return None


def _format_nodes(java: str, configs: dict[Path, Path], cluster_id: str) -> None:
    """Format the nodes not formatted yet, in parallel (each is a JVM start)."""
    procs = {node_dir: subprocess.Popen(format_command(java, config, cluster_id),
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
    recorded = len(node_dirs(data_dir))
    if recorded and recorded != brokers:
        raise BrokerError(f"{data_dir} holds a cluster of {recorded}, not of {brokers} brokers")
    running = cluster_status(data_dir)
    if running is not None and not running.missing:
        return running, False
    java = java_binary()
    classpath()
    alive = {n.node_id for n in running.nodes} if running else set()
    to_start = [i for i in range(1, brokers + 1) if i not in alive]
    for node_id in to_start:
        for p in _node_ports(port, node_id):
            if not port_free(p):
                raise BrokerError(f"port {p} on 127.0.0.1 is already in use")
    configs = {}
    for node_id in to_start:
        node_dir = data_dir / f"node-{node_id}"
        node_dir.mkdir(parents=True, exist_ok=True)
        configs[node_dir] = cluster_config(node_dir, node_id, port, brokers)
    _format_nodes(java, configs, _recorded_cluster_id(data_dir) or new_cluster_id())
    started = time.monotonic()
    procs = {int(node_dir.name[5:]): start_jvm(java, config, node_dir,
                                                _node_ports(port, int(node_dir.name[5:]))[0],
                                                heap_mb)
             for node_dir, config in configs.items()}
    try:
        _wait_cluster(procs, data_dir, port, brokers, timeout_s)
    except BrokerError:
        terminate(*(proc.pid for proc in procs.values()))
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
                                  f"{log_cause(data_dir / f'node-{node_id}')}")
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
                      f"{log_cause(data_dir / f'node-{node_id}')}")


def down_cluster(data_dir: Path = DEFAULT_DATA) -> ClusterInfo | None:
    """Stop every node recorded in ``data_dir`` together; returns what was running, or None."""
    data_dir = data_dir.resolve()
    running = cluster_status(data_dir)
    if running is not None:
        terminate(*(node.pid for node in running.nodes))
    for node_dir in node_dirs(data_dir):
        (node_dir / "broker.pid").unlink(missing_ok=True)
    return running
