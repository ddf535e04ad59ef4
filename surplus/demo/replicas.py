"""The opportunistic replicas' lives during a demo run: when each starts and is taken back,
their CPU slices and the usage each slice records.

A replica starts when its capacity is lent and is stopped at the deadline of the notice that
takes it back (``plan.replica_changes``); ``ReplicaBook.follow`` applies the changes whose
time has come, and ``sample`` writes each running slice's usage counter to ``slices.jsonl``
about once a second, a replica counting as lent from its readiness to its reclaim. The run
owns the processes (``children``, shared with it); the book only starts and stops the
opportunistic ones and remembers what it did.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schemas.clock import wall_ms
from surplus.demo import report, slices
from surplus.demo.options import DemoOptions
from surplus.live import plan
from surplus.live.procs import Child


class ReplicaBook:
    """What is known of each opportunistic replica's life in one run.

    :param options: the run's options (slices on or off, their size and period).
    :param out: the run's output directory (``slices.jsonl`` is written there).
    :param children: the run's processes by name; the book starts and stops replicas in it.
    :param say: prints one line to the user.
    :param ready: ``ready(worker_id, timeout_s)``: the replica's ``/readyz`` answers 200.
    :param scrape: the replica's ``/metrics`` text, None where it does not answer.
    """

    def __init__(self, options: DemoOptions, out: Path, children: dict[str, Child],
                 say: Callable[[str], None], ready: Callable[[str, float], bool],
                 scrape: Callable[[str], str | None]) -> None:
        self.opt = options
        self.out = out
        self.children = children
        self.say = say
        self.ready = ready
        self.scrape = scrape
        #: Wall-clock start of the run's timeline (0 before the load starts).
        self.start_ms = 0
        #: Replica changes still to come, and those done: (seconds into the run, worker, what).
        self.pending: list[plan.ReplicaChange] = []
        self.log: list[tuple[float, str, str]] = []
        #: Workers expected not to run now (not lent yet, or taken back).
        self.offline: set[str] = set()
        #: /metrics of replica processes already taken back, by ``worker_id#n``.
        self.scraped: dict[str, str] = {}
        #: The opportunistic replicas' CPU slices, and what is known of each replica's life:
        #: how many it has had, and whether the current one serves its lent capacity.
        self.cpu = slices.CpuSlices(0, "not opened")
        self.lives: dict[str, int] = {}
        self.serving: dict[str, bool] = {}
        self.next_sample = 0.0

    # -- CPU slices ------------------------------------------------------------------------

    def open_slices(self, replicas: list[plan.Replica]) -> dict[str, slices.Slice]:
        """A CPU slice per opportunistic replica, of its grant's size (one unit each, see
        ``DemoOptions.cores_per_unit``); where this host allows none, the run goes on
        without and says why here and in its summary."""
        lent = [r for r in replicas if r.tier == "opportunistic"]
        if not lent:
            return {}
        if not self.opt.slices:
            self.cpu = slices.CpuSlices(0, "turned off (--no-slices)")
        else:
            self.cpu = slices.CpuSlices.open(f"surplus-demo-{os.getpid()}")
        made: dict[str, slices.Slice] = {}
        try:
            if self.cpu.version:
                quota = slices.quota_for(self.opt.cores_per_unit, self.opt.slice_period_us)
                weight = slices.nice_weight(0)
                made = {r.worker_id: self.cpu.make(r.worker_id, quota, weight) for r in lent}
        except slices.SliceError as exc:
            self.cpu.close()
            self.cpu = slices.CpuSlices(0, str(exc))
            made = {}
        if made:
            q = next(iter(made.values())).quota
            self.say(f"cpu slices ({self.cpu.mode}): each opportunistic replica gets "
                     f"{q.cores:g} cores ({q.quota_us} us every {q.period_us} us)")
        else:
            self.say(f"WARNING: no CPU slices ({self.cpu.reason}): the opportunistic replicas "
                     "share every core, so what is lent bounds nothing, and their busy share "
                     "is what they report, not a share of a quota")
        return made

    def slices_info(self) -> dict[str, Any]:
        """The slices as ``run.json`` records them: mode (or why none), cores by replica."""
        cores = {w: s.quota.cores for w, s in self.cpu.slices.items()}
        period = next(iter(self.cpu.slices.values())).quota.period_us if cores else None
        return {"mode": self.cpu.mode if cores else "none",
                **({"reason": self.cpu.reason or "no slice could be made"} if not cores else {}),
                "cores": cores, "period_us": period,
                "cores_per_unit": self.opt.cores_per_unit}

    def sample(self, *, force: bool = False, ending: tuple[str, ...] = ()) -> None:
        """About once a second, each running slice's usage counter (``slices.jsonl``); a
        replica counts as lent from its readiness to its reclaim (``ending`` takes a last
        sample of those being reclaimed now, still lent)."""
        if not self.cpu.slices or (not force and time.monotonic() < self.next_sample):
            return
        self.next_sample = time.monotonic() + 1.0
        rows = []
        for worker_id, slice_ in self.cpu.slices.items():
            if worker_id not in self.lives:
                continue
            child = self.children.get(worker_id)
            lent = worker_id not in self.offline or worker_id in ending
            if lent and not self.serving.get(worker_id):
                self.serving[worker_id] = self.ready(worker_id, 0.5)
            try:
                usage = slice_.usage_usec()
            except (OSError, ValueError):
                continue
            rows.append({"t_s": round((wall_ms() - self.start_ms) / 1000.0, 3),
                         "mono_s": round(time.monotonic(), 4), "worker_id": worker_id,
                         "life": self.lives[worker_id], "usage_usec": usage,
                         "cores": slice_.quota.cores,
                         "lent": bool(lent and self.serving.get(worker_id)
                                      and child is not None)})
        if rows:
            with (self.out / report.SLICES).open("a") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in rows)

    def close(self) -> list[str]:
        """Remove the slices; returns those still in use."""
        return self.cpu.close()

    # -- lent and taken back ---------------------------------------------------------------

    def follow(self) -> None:
        """Start and take back opportunistic replicas whose time has come (from the watch loop:
        children are started from the main thread, whose end is their parent-death signal)."""
        now = wall_ms()
        while self.pending and self.start_ms + self.pending[0].at_ms <= now:
            change = self.pending.pop(0)
            (self.up if change.up else self.down)(change.worker_id)
            self.log.append((round((wall_ms() - self.start_ms) / 1000.0, 3),
                             change.worker_id, "started" if change.up else "reclaimed"))

    def up(self, worker_id: str) -> None:
        """Capacity lent: a new replica process starts (clients route to it once it announces
        itself serving). One still draining from its last reclaim is waited for first."""
        child = self.children[worker_id]
        if child.alive():
            child.stop(signal.SIGTERM, 10.0)
        child.start()
        self.offline.discard(worker_id)
        self.lives[worker_id] = self.lives.get(worker_id, 0) + 1
        self.serving[worker_id] = False
        self.say(f"replica {worker_id}: capacity lent, starting")

    def down(self, worker_id: str) -> None:
        """The notice's deadline: the owner takes the machine back. Scrape first (the reaction
        histogram lives in the process), then stop it as a reclaimed machine goes: it serves
        what it has queued and exits while the run goes on."""
        self.offline.add(worker_id)
        self.sample(force=True, ending=(worker_id,))
        self.serving[worker_id] = False
        text = self.scrape(worker_id)
        if text is not None:
            self.scraped[f"{worker_id}#{len(self.scraped) + 1}"] = text
        self.children[worker_id].send(signal.SIGTERM)
        self.say(f"replica {worker_id}: capacity reclaimed, stopping")


def niceness_shortfalls(children: dict[str, Child], replicas: list[plan.Replica],
                        started: list[str], want: int) -> list[str]:
    """A note for each provisioned replica in ``started`` not given its niceness ``want``
    (not root): its baseline work then shares the CPU evenly with everything else here."""
    notes = []
    provisioned = {r.worker_id for r in replicas if r.tier != "opportunistic"}
    for worker_id in started:
        popen = children[worker_id].popen
        if not want or popen is None or worker_id not in provisioned:
            continue
        with contextlib.suppress(OSError):
            got = os.getpriority(os.PRIO_PROCESS, popen.pid) - os.getpriority(
                os.PRIO_PROCESS, 0)
            if got != want:
                notes.append(f"note: {worker_id} runs at niceness {got:+d}, not {want:+d} "
                             "(needs root): its baseline work shares the CPU evenly")
    return notes
