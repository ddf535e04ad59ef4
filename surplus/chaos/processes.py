"""Faults on the fleet's processes, each from its injection to its healing: a broker killed
and brought back or paused and resumed, the control plane killed and a new one started, a
worker killed and restarted, frozen and resumed, or restarted with its clock off and then
set right.

Processes are started on one spawner thread, alive the whole run: a child dies with the
thread that started it (`surplus.live.procs`: PR_SET_PDEATHSIG is per thread), and each
fault's thread ends when the fault heals.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from schemas.clock import OFFSET_ENV
from surplus import localkafka
from surplus.chaos.errors import ChaosError
from surplus.chaos.schedule import Fault
from surplus.fleet.fleet import Fleet
from surplus.fleet.procs import WorkerProc
from surplus.fleet.toxiproxy import Toxiproxy

#: Seconds a broker, a control plane or a worker may take to come back before the run fails.
RESTART_TIMEOUT_S = 180.0


class ProcessFaults:
    """The process faults of one run; each method injects one, holds it and heals it.

    :param fleet: the running fleet (its control planes and workers).
    :param proxies: the toxiproxy in front of each worker, pointed at a restarted one.
    :param cluster_dir: the cluster's data directory (`surplus.localkafka`).
    :param cluster_port: the first port of the cluster's block, to bring a node back.
    :param brokers: the cluster's node count.
    :param hold: waits out a fault's hold (shorter when the run stops).
    """

    def __init__(self, fleet: Fleet, proxies: Toxiproxy, *, cluster_dir: Path,
                 cluster_port: int, brokers: int, hold: Callable[[Fault], None]) -> None:
        self.fleet = fleet
        self.toxi = proxies
        self.cluster_dir = cluster_dir
        self.port = cluster_port
        self.brokers = brokers
        self._hold = hold
        self._control_n = len(fleet.controls)
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="chaos-spawner")

    def close(self) -> None:
        """Let the spawner thread go (the processes it started are the fleet's to stop)."""
        self._spawner.shutdown(wait=False)

    def _node_pid(self, node: int) -> int:
        status = localkafka.cluster_status(self.cluster_dir)
        if status is None:
            raise ChaosError("the cluster is not running")
        return status.node(node).pid

    def broker_kill(self, fault: Fault) -> str:
        os.killpg(self._node_pid(int(fault.target)), signal.SIGKILL)
        self._hold(fault)
        info, _ = self._spawner.submit(
            lambda: localkafka.up_cluster(self.brokers, port=self.port, data_dir=self.cluster_dir,
                                          timeout_s=RESTART_TIMEOUT_S)).result()
        return f"node {fault.target} back in {info.started_in_s or 0:.1f} s"

    def broker_pause(self, fault: Fault) -> str:
        pid = self._node_pid(int(fault.target))
        os.killpg(pid, signal.SIGSTOP)
        try:
            self._hold(fault)
        finally:
            os.killpg(pid, signal.SIGCONT)
        return ""

    def control_kill(self, fault: Fault) -> str:
        self.fleet.controls[-1].kill()
        self._hold(fault)
        self._control_n += 1
        name = f"cp{self._control_n}"
        fleet = self.fleet
        self._spawner.submit(lambda: fleet.control_plane(name)).result()
        return f"{name} started"

    def restart(self, name: str, env: dict[str, str] | None = None) -> WorkerProc:
        """A new process for worker ``name`` (the old one stopped or killed), started on the
        spawner thread and pointed at by its proxy once ready, or once it serves reclaimed: a
        powerful replica restarted while a storm's notices for its pool were pending applies
        them and serves baseline only from their deadline on, never ready (CI's fault suite
        hung 180 s in such a restart, seed 7, a worker kill of p1 beside a notice storm)."""
        fleet = self.fleet
        worker = self._spawner.submit(
            lambda: fleet.restart_worker(name, env=env, timeout_s=RESTART_TIMEOUT_S,
                                         draining_ok=True)).result()
        self.toxi.set_upstream(name, worker.port)
        return worker

    def worker_kill(self, fault: Fault) -> str:
        self.fleet.workers[fault.target].kill()
        self._hold(fault)
        self.restart(fault.target)
        return ""

    def worker_freeze(self, fault: Fault) -> str:
        worker = self.fleet.workers[fault.target]
        worker.send(signal.SIGSTOP)
        try:
            self._hold(fault)
        finally:
            worker.send(signal.SIGCONT)
        return ""

    def clock_jump(self, fault: Fault) -> str:
        self.restart(fault.target, env={OFFSET_ENV: fault.param})
        self._hold(fault)
        self.restart(fault.target, env={OFFSET_ENV: "0"})
        return "restarted with its clock off, then set right"
