"""The nemesis of `surplus chaos`: each fault of the schedule, from its start to its healing.

`Nemesis.inject` runs one fault (`surplus.chaos.schedule.Fault`) on the caller's thread,
holding what it occupies (a broker, a worker, the control plane): a fault whose process is
still healing from an earlier one is recorded as not injected rather than piled on. Every
fault, notice, grant and forged message goes to the `Recorder` as a history record
(`surplus.chaos.history`). The fleet, the proxies in front of its workers, the recorder and
the keyring come in explicitly; `surplus.chaos.run` sets them up and sequences the schedule.

Each kind of fault is injected and healed where its kind lives: on processes
(`surplus.chaos.processes`), on the network (`surplus.chaos.network`), or made of messages
(`surplus.chaos.messages`, forgeries in `surplus.chaos.forgery`); this module keeps what
every fault shares, the holding, the recording and the errors.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from schemas.kafka_config import KafkaSettings
from schemas.signing import Keyring
from surplus.chaos import history as h
from surplus.chaos.errors import ChaosError
from surplus.chaos.forgery import digest
from surplus.chaos.messages import Messages
from surplus.chaos.network import NetworkFaults
from surplus.chaos.processes import RESTART_TIMEOUT_S, ProcessFaults
from surplus.chaos.recorder import Recorder
from surplus.chaos.schedule import Fault
from surplus.fleet.fleet import Fleet
from surplus.fleet.procs import TopicReader
from surplus.fleet.toxiproxy import Toxiproxy

# The names other modules import from here (`surplus.chaos.run`, the tests).
__all__ = ["RESTART_TIMEOUT_S", "ChaosError", "Nemesis", "Recorder", "digest"]


class Nemesis:
    """Injects faults into a running fleet and records what it did. `inject` may run on
    several threads at once (faults overlap); processes it restarts are started on one
    spawner thread of its own, alive until `close`."""

    def __init__(self, fleet: Fleet, proxies: Toxiproxy, recorder: Recorder,
                 keyring: Keyring, *, kafka: KafkaSettings, cluster_dir: Path,
                 cluster_port: int, brokers: int, targets: TopicReader, seed: int, t0: float,
                 stop: threading.Event, say: Callable[[str], None] = print) -> None:
        """
        :param fleet: the running fleet (its control planes and workers, its load's clock).
        :param proxies: the toxiproxy in front of each worker, proxies named by worker.
        :param recorder: where every fault, notice, grant and forgery is recorded.
        :param keyring: the fleet's keyring: genuine notices are signed with it, and a
            forgery with a bad signature claims its signing key id.
        :param kafka: the cluster's settings, to publish notices, targets and forgeries.
        :param cluster_dir: the cluster's data directory (`surplus.localkafka`).
        :param cluster_port: the first port of the cluster's block, to bring a node back.
        :param brokers: the cluster's node count.
        :param targets: a reader following the targets topic: the genuine targets to
            duplicate, reorder and forge from.
        :param seed: the run's seed (notice ids, each fault's own random draws).
        :param t0: load time at which the schedule's clock starts (for what is printed).
        :param stop: set when the run stops: a fault's hold ends early.
        :param say: where each healed fault is printed.
        """
        self.fleet = fleet
        self.rec = recorder
        self.seed = seed
        self.t0 = t0
        self.say = say
        self._stop = stop
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        #: Faults that could not be injected, with why.
        self.errors: list[str] = []
        self.processes = ProcessFaults(fleet, proxies, cluster_dir=cluster_dir,
                                       cluster_port=cluster_port, brokers=brokers,
                                       hold=self._hold)
        self.network = NetworkFaults(proxies, self._hold)
        self.messages = Messages(fleet, recorder, keyring, kafka=kafka, targets=targets,
                                 seed=seed, hold=self._hold, lend_again=self._lend_again)
        #: Each kind of fault (`surplus.chaos.schedule.KINDS`) by who injects and heals it.
        self._kinds: dict[str, Callable[[Fault], str]] = {
            "broker_kill": self.processes.broker_kill,
            "broker_pause": self.processes.broker_pause,
            "control_kill": self.processes.control_kill,
            "worker_kill": self.processes.worker_kill,
            "worker_freeze": self.processes.worker_freeze,
            "clock_jump": self.processes.clock_jump,
            "net_delay": self.network.net_delay,
            "net_cut": self.network.net_cut,
            "notice_storm": self.messages.notice_storm,
            "duplicate": self.messages.duplicate,
            "reorder": self.messages.reorder,
            "forge": self.messages.forge,
        }

    def now(self) -> float:
        """Load time (seconds), the history's time base."""
        return self.fleet.runner.now()

    def close(self) -> None:
        """Let the spawner thread go (the processes it started are the fleet's to stop)."""
        self.processes.close()

    # -- faults ------------------------------------------------------------------------------------

    def _lock(self, name: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(name, threading.Lock())

    def inject(self, fault: Fault) -> None:
        """Run one fault from its start to its healing, holding what it occupies."""
        held: list[threading.Lock] = []
        for resource in sorted(fault.resources()):
            lock = self._lock(resource)
            if not lock.acquire(blocking=False):
                for other in held:
                    other.release()
                self._record(fault, self.now(), self.now(), ok=False,
                             detail=f"{resource} still healing from an earlier fault")
                return
            held.append(lock)
        started = self.now()
        try:
            detail = self._kinds[fault.kind](fault)
            self._record(fault, started, self.now(), ok=True, detail=detail or "")
        except Exception as exc:  # a fault that could not be injected is recorded, not fatal
            self._record(fault, started, self.now(), ok=False,
                         detail=f"{type(exc).__name__}: {exc}"[:500])
            self.errors.append(f"{fault.kind}:{fault.target}: {exc}")
        finally:
            for lock in held:
                lock.release()

    def _record(self, fault: Fault, t: float, end_t: float, *, ok: bool, detail: str) -> None:
        self.rec.add(h.FaultRecord(t=round(t, 3), end_t=round(end_t, 3), kind=fault.kind,
                                   target=fault.target, param=fault.param,
                                   baseline_path=fault.on_baseline_path, ok=ok, detail=detail))
        mark = "" if ok else " (not injected)"
        t, end_t = t - self.t0, end_t - self.t0
        self.say(f"  {t:7.1f}s {fault.kind:<13} {fault.target:<5} {fault.param:<22} "
                 f"healed {end_t:7.1f}s{mark} {detail[:80]}")

    def _lend_again(self, name: str) -> str:
        """A replica lent again after a reclaim is a new life, as the platform would give: a
        replica does no optional work past a reclaim's deadline (`workers.policy.replica`).
        Restarted after the grant, unless a fault of its own holds it (then it stays
        reclaimed, serving baseline only)."""
        lock = self._lock(f"worker:{name}")
        if not lock.acquire(blocking=False):
            return f"; {name} held by another fault, not restarted"
        try:
            self.fleet.workers[name].kill()
            self.processes.restart(name)
        finally:
            lock.release()
        return f"; {name} restarted"

    def _hold(self, fault: Fault) -> None:
        self._stop.wait(fault.hold_s)
