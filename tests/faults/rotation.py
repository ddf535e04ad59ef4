"""The demo fleet with a key rotated under it and forged messages written to its topics by kcat.

`RotatingDemo` is `surplus demo` (its own embedded broker, every process real) whose watch
loop (`Demo._observe`, called about four times a second while the load runs) drives:

1. **Rotation** by changing the files of the run's key directory, as an operator would
   (docs/security.md): add ``next`` with ``active`` still naming ``demo``; write ``next`` to
   ``active``; delete ``demo``. Each step waits until every process holding the keys then
   (control plane, scheduler, load generator, the workers running) has logged the new ring,
   so the next step never races a slow re-read; a step waits for every worker running to be
   ready, since one starting may read the directory before the step or after it. Signing
   switches before the storm, so its notices (and the workers' own on SIGTERM) are signed
   with ``next``; ``demo`` is retired
   once the reclaimed replicas are back and ready, and no earlier than leases and TTLs allow.
2. **Forgeries**, after the retirement, by kcat (a producer outside Surplus), each a file
   sent as one message to the scope's partition: an unsigned notice, a notice signed with a
   key id nobody holds, a grant with a bad signature, a notice, a grant and a fresh target
   signed with the retired key, a genuine target signed with the retired key replayed, and a
   genuine target of the new key replayed. The two replays are past their TTL, so every reader
   drops them as expired before judging their signature (`workers.policy.targets`).

Each receiver's counters are scraped just before the forgeries and near the end; the
dead-letter topic and the targets are read then too (the embedded broker stops with the run).
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from schemas.clock import wall_ms
from schemas.codec import decode, encode
from schemas.contract import CapacityEvent, ControlTargets, DeadLetter, PreemptionNotice
from schemas.signing import ACTIVE_FILE, Keyring
from schemas.topics import scope_partition
from surplus.demo.children import ready
from surplus.demo.options import DemoError
from surplus.demo.run import Demo
from surplus.fleet.procs import TopicReader
from surplus.live.procs import metrics_text

OLD, NEW = "demo", "next"
#: Holders that run the whole time (workers are added as they run).
HOLDERS = ("control-plane", "scheduler", "loadgen")
#: Seconds a step may wait for every holder to re-read the directory (10 s period each).
RELOAD_TIMEOUT_S = 60.0
#: Seconds between the switch taking hold everywhere and the retirement: longer than the
#: scenario's grant lease (10 s) and targets' TTL (12 s in the light demo), so nothing signed
#: with the old key is still needed.
RETIRE_AFTER_S = 20.0
#: Seconds before a reclaim's deadline (when the demo stops a replica) that signing must have
#: switched everywhere: the storm's notices go out a second before it.
NOTICE_MARGIN_S = 3.0
#: Seconds before the end of the load that the last counters are read.
FINAL_BEFORE_END_S = 8.0
#: What each forgery is, the topic it goes to, and the refusal every receiver of that topic
#: must count for it (None: not a signature refusal; both replays are counted ``expired``).
FORGERIES = {
    "unsigned_notice": ("preemption", "unsigned"),
    "unknown_key_notice": ("preemption", "unknown_key"),
    "bad_signature_grant": ("capacity", "bad_signature"),
    "retired_key_notice": ("preemption", "unknown_key"),
    "retired_key_grant": ("capacity", "unknown_key"),
    "retired_key_target": ("targets", "unknown_key"),
    "replayed_retired_target": ("targets", None),
    "replayed_stale_target": ("targets", None),
}
#: How far past the newest genuine epoch the fresh target signed with the retired key claims.
FORGED_EPOCH_JUMP = 1_000_000


def ring_line(key_ids: list[str], signing_id: str) -> str:
    """How a process logs the ring it reloaded (`Keyring.__repr__`)."""
    return repr(Keyring({k: b"x" for k in key_ids}, signing_id))


def samples(text: str | None) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """A /metrics text's samples by (name, labels)."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text or ""):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def count(scraped: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in scraped.items() if n == name and want <= ls)


@dataclass
class Step:
    name: str
    at_s: float
    line: str
    #: Holder name -> pid when the step was taken: each must log ``line`` (or have restarted).
    waiting: dict[str, int]
    done_s: float | None = None


@dataclass
class Observed:
    """What the run showed; the tests judge it."""

    steps: list[Step] = field(default_factory=list)
    storm_at_s: float = 0.0
    #: Forgery name -> the exact bytes kcat sent.
    forged: dict[str, bytes] = field(default_factory=dict)
    forged_at_s: float | None = None
    kcat: list[str] = field(default_factory=list)
    #: Process name -> /metrics text just before the forgeries and near the end.
    before: dict[str, str | None] = field(default_factory=dict)
    after: dict[str, str | None] = field(default_factory=dict)
    #: The reclaimed replicas' lives, scraped as they were stopped.
    reclaimed: dict[str, str] = field(default_factory=dict)
    deadletters: list[DeadLetter] = field(default_factory=list)
    targets: list[ControlTargets] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)
    ready_at_end: dict[str, bool] = field(default_factory=dict)
    final_at_s: float | None = None
    start_ms: int = 0
    #: The demo's replica changes: (s into the load, worker, started/reclaimed).
    replica_log: list[tuple[float, str, str]] = field(default_factory=list)


class RotatingDemo(Demo):
    """`surplus demo` with the rotation and the forgeries above driven from its watch loop."""

    observed: Observed

    def _prepare(self) -> None:
        super()._prepare()
        self.observed = Observed(workers=[r.worker_id for r in self.replicas])
        self.observed.storm_at_s = min((at for at, _, how in self.changes_s() if not how),
                                       default=0.0)
        self._old_ring = Keyring({OLD: (self.keys / OLD).read_text().strip()}, OLD)
        self._next_check = 0.0

    def changes_s(self) -> list[tuple[float, str, bool]]:
        return [(c.at_ms / 1000.0, c.worker_id, c.up) for c in self.changes]

    # -- the watch loop's hook -----------------------------------------------------------------

    def _observe(self) -> None:
        if time.monotonic() < self._next_check:
            return
        self._next_check = time.monotonic() + 0.5
        t = (wall_ms() - self.start_ms) / 1000.0
        o = self.observed
        steps = {s.name: s for s in o.steps}
        if steps and not self._settled(steps[o.steps[-1].name], t):
            return
        if "retire" not in steps and not self._running_ready():
            return   # a worker starting may read the directory before or after a step
        if "add" not in steps and t >= 2.0:
            self._write(ACTIVE_FILE, OLD)    # first: two keys and no `active` is no ring
            self._write(NEW, secrets.token_hex(32))
            self._step("add", t, [OLD, NEW], OLD)
        elif "add" in steps and "switch" not in steps:
            self._write(ACTIVE_FILE, NEW)
            self._step("switch", t, [OLD, NEW], NEW)
        elif "switch" in steps and "retire" not in steps:
            switched = steps["switch"].done_s
            assert switched is not None
            if switched > o.storm_at_s - NOTICE_MARGIN_S:
                raise DemoError(f"signing switched everywhere only at {switched:.1f}s, after "
                                f"the storm at {o.storm_at_s:.1f}s: the run cannot judge it")
            if t >= switched + RETIRE_AFTER_S and not self.book.pending and self._all_ready():
                (self.keys / OLD).unlink()
                self._step("retire", t, [NEW], NEW)
        elif "retire" in steps and o.forged_at_s is None:
            o.before = self._scrape_all()
            self._forge(t)
        elif (o.forged_at_s is not None and o.final_at_s is None
              and t >= self.opt.duration_s - FINAL_BEFORE_END_S):
            self._final(t)

    def _write(self, name: str, text: str) -> None:
        """Replace a file of the key directory at once (written aside as a dotfile, which
        readers skip, then renamed), so no reader sees it half-written."""
        aside = self.keys / f".{name}.tmp"
        aside.write_text(text + "\n")
        aside.chmod(0o600)
        aside.replace(self.keys / name)

    def _holders(self) -> dict[str, int]:
        names = [*HOLDERS, *(w for w in self.observed.workers if w not in self.book.offline)]
        out = {}
        for name in names:
            child = self.children.get(name)
            if child is not None and child.alive() and child.popen is not None:
                out[name] = child.popen.pid
        return out

    def _step(self, name: str, t: float, key_ids: list[str], signing_id: str) -> None:
        self.say(f"rotation: {name} at {t:.1f}s (keys {key_ids}, signing {signing_id})")
        self.observed.steps.append(Step(name, t, ring_line(key_ids, signing_id),
                                        self._holders()))

    def _settled(self, step: Step, t: float) -> bool:
        """Whether every holder of the keys at ``step`` has re-read them (a process started
        since read the directory as it was then)."""
        if step.done_s is not None:
            return True
        for name, pid in list(step.waiting.items()):
            child = self.children[name]
            if (not child.alive() or child.popen is None or child.popen.pid != pid
                    or step.line in child.log_path.read_text(errors="replace")):
                del step.waiting[name]
        if step.waiting:
            if t - step.at_s > RELOAD_TIMEOUT_S:
                raise DemoError(f"rotation step {step.name}: {sorted(step.waiting)} did not "
                                f"log {step.line} within {RELOAD_TIMEOUT_S:.0f}s")
            return False
        step.done_s = t
        self.say(f"rotation: {step.name} taken by every process at {t:.1f}s")
        return True

    def _running_ready(self) -> bool:
        """Whether every worker running has read its keys (a ready one has), so that each must
        log the next step's ring."""
        return all(ready(self.ports.workers[w], 1.0) for w in self.observed.workers
                   if w not in self.book.offline and self.children[w].alive())

    def _all_ready(self) -> bool:
        return all(self.children[w].alive() and ready(self.ports.workers[w], 1.0)
                   for w in self.observed.workers)

    def _scrape_all(self) -> dict[str, str | None]:
        out = {"control-plane": metrics_text(self.ports.control)}
        out.update({w: metrics_text(self.ports.workers[w]) for w in self.observed.workers})
        return out

    # -- forgeries -------------------------------------------------------------------------------

    def _forge(self, t: float) -> None:
        kcat = shutil.which("kcat")
        if kcat is None:
            raise DemoError("kcat is not on the PATH (`make kcat`; Debian: apt install kcat)")
        assert self.kafka is not None
        targets = self._read_targets()
        old = [x for x in targets if x[1].key_id == OLD]
        new = [x for x in targets if x[1].key_id == NEW]
        if not old or len(new) < 2:
            raise DemoError(f"targets on the topic: {len(old)} signed with {OLD}, {len(new)} "
                            f"with {NEW}: nothing to replay")
        region = self.region.name
        ranking = next(r.pool_id for r in self.replicas
                       if r.tier == "opportunistic" and r.model == "baseline")
        powerful = next(r.pool_id for r in self.replicas if r.model == "powerful")
        now = wall_ms()
        intruder = Keyring({"intruder": secrets.token_bytes(32)}, "intruder")
        guess = Keyring({NEW: secrets.token_bytes(32)}, NEW)

        def notice(name: str, pool: str) -> PreemptionNotice:
            return PreemptionNotice(notice_id=f"forged-{name}", ts_ms=now, region=region,
                                    pool_id=pool, deadline_ms=now + 1000)

        def grant(name: str) -> CapacityEvent:
            return CapacityEvent(event_id=f"forged-{name}", ts_ms=now, region=region,
                                 pool_id=powerful, kind="grant", accelerator="cpu",
                                 accelerator_units=64.0, cpu_units=64.0,
                                 expires_at_ms=now + 600_000)

        payloads = {
            "unsigned_notice": encode(notice("unsigned", ranking)),
            "unknown_key_notice": encode(intruder.sign(notice("unknown-key", powerful))),
            "bad_signature_grant": encode(guess.sign(grant("bad-signature"))),
            "retired_key_notice": encode(self._old_ring.sign(notice("retired", ranking))),
            "retired_key_grant": encode(self._old_ring.sign(grant("retired"))),
            "retired_key_target": encode(self._old_ring.sign(msgspec.structs.replace(
                new[-1][1], epoch=new[-1][1].epoch + FORGED_EPOCH_JUMP, issued_at_ms=now))),
            "replayed_retired_target": old[-1][0],
            "replayed_stale_target": new[0][0],
        }
        forged_dir = self.out / "forged"
        forged_dir.mkdir(exist_ok=True)
        partition = str(scope_partition(region))
        for name, payload in payloads.items():
            logical, _ = FORGERIES[name]
            path = forged_dir / f"{name}.json"
            path.write_bytes(payload)
            cmd = [kcat, "-P", "-b", self.kafka.bootstrap, "-t", self.kafka.topic(logical),
                   "-p", partition, "-k", region, "-X", "acks=all", str(path)]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            self.observed.kcat.append(" ".join(cmd[1:]))
            if done.returncode != 0 or "fail" in done.stderr.lower():
                raise DemoError(f"kcat could not produce {name}: {done.stderr.strip()}")
        self.observed.forged = payloads
        self.observed.forged_at_s = t
        self.say(f"forgeries: {len(payloads)} messages produced by kcat at {t:.1f}s")

    def _read_targets(self) -> list[tuple[bytes, ControlTargets]]:
        assert self.kafka is not None
        reader = TopicReader(self.kafka, "targets")
        try:
            reader.poll(2.0)
            return [(m.value(), decode(ControlTargets, m.value())) for m in reader.messages
                    if m.key() == self.region.name.encode()]
        finally:
            reader.close()

    def _final(self, t: float) -> None:
        o = self.observed
        o.after = self._scrape_all()
        o.reclaimed = dict(self.book.scraped)
        o.ready_at_end = {w: ready(self.ports.workers[w], 2.0) for w in o.workers}
        assert self.kafka is not None
        reader = TopicReader(self.kafka, "deadletter")
        try:
            reader.poll(3.0)
            o.deadletters = [decode(DeadLetter, m.value()) for m in reader.messages]
        finally:
            reader.close()
        o.targets = [event for _, event in self._read_targets()]
        o.replica_log = list(self.book.log)
        o.start_ms = self.start_ms
        o.final_at_s = t
