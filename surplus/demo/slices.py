"""CPU slices for the demo's opportunistic replicas: each runs in a cgroup whose CPU quota is
the size of its grant, so the lent capacity the control plane plans with is a real bound.

Without a slice, every replica of the demo shares the same cores, and no quantity of optional
work is bounded by what was lent: a "lent unit" would be a label, and its busy share would say
nothing. With a slice, a replica given 0.25 of a core cannot use more, whatever it is asked
to do, and its busy share is measured by the kernel: CPU time used (the cgroup's usage
counter) over the quota time of the slice while it is lent (``busy_share``).

Both cgroup hierarchies are supported, because both are what a root user finds: cgroup v2
(``cpu.max``, ``cpu.stat``'s ``usage_usec``, ``cpu.weight``) and v1 (``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``, ``cpuacct.usage``, ``cpu.shares``), which hybrid hosts still mount for
the cpu controller. Where neither can be written (not root, a v2 cgroup that holds processes
of its own, no cpu controller), ``CpuSlices.open`` says why in ``reason`` and the demo runs
without slices and says so in its summary. The files are a few lines to write; the Python
cgroup packages on PyPI cover v1 only (cgroupspy) or only read, so this module writes them.

The arithmetic and the parsing are pure functions (tested on their own); the parsing of the
quota files and of where a cgroup is lives in ``workers.capacity.cgroup``, shared with the
capacity agent that reads the slice it lends. ``CpuSlices`` and ``Slice`` do the file I/O.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from workers.capacity.cgroup import Mount, Quota, parse_mountinfo, parse_proc_cgroup
from workers.capacity.cgroup import parse_cpu_max as parse_cpu_max  # the demo's readers use it

#: The quota period the demo's slices use. Shorter than the kernel's 100 ms default on
#: purpose: a slice that spends its quota early in a period waits out the rest of it, every
#: thread of the replica with it (the one that reads a preemption notice too), so at 100 ms a
#: 0.5-core replica could hold a notice 50 ms; at 5 ms the longest such wait is 2.5 ms, inside
#: the 5 ms notice-to-shed goal. Kubernetes keeps 100 ms, where reactions are not this tight.
DEFAULT_PERIOD_US = 5_000
MIN_QUOTA_US = 1_000
"""The kernel refuses a quota under 1 ms (``cpu.cfs_quota_us`` / ``cpu.max``)."""
MAX_PERIOD_US = 1_000_000
#: Linux's weights of nice levels 0..19 (``sched_prio_to_weight``): a slice's share of a
#: contended CPU, set from the niceness the demo gives opportunistic replicas.
NICE_WEIGHTS = (1024, 820, 655, 526, 423, 335, 272, 215, 172, 137,
                110, 87, 70, 56, 45, 36, 29, 23, 18, 15)


class SliceError(RuntimeError):
    """A slice cannot be made; the message says which file refused and why."""


# -- pure: quota arithmetic and parsing -----------------------------------------------------

def quota_for(cores: float, period_us: int = DEFAULT_PERIOD_US) -> Quota:
    """The quota of a slice of ``cores`` CPUs: ``cores * period`` microseconds a period, never
    under the kernel's 1 ms minimum (a smaller slice gets a longer period instead, so its
    share of a core stays what was granted)."""
    if not cores > 0:
        raise ValueError(f"a CPU slice needs cores > 0, got {cores}")
    if not 0 < period_us <= MAX_PERIOD_US:
        raise ValueError(f"quota period must be in (0, {MAX_PERIOD_US}] us, got {period_us}")
    quota = round(cores * period_us)
    if quota < MIN_QUOTA_US:
        period_us = min(MAX_PERIOD_US, round(MIN_QUOTA_US / cores))
        quota = max(MIN_QUOTA_US, round(cores * period_us))
    return Quota(quota, period_us)


def usage_usec_v2(cpu_stat: str) -> int:
    """CPU time used by a cgroup v2 group, from its ``cpu.stat`` (``usage_usec`` line)."""
    for line in cpu_stat.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value)
    raise ValueError("cpu.stat has no usage_usec line")


def usage_usec_v1(cpuacct_usage: str) -> int:
    """CPU time used by a cgroup v1 group, from ``cpuacct.usage`` (nanoseconds)."""
    return int(cpuacct_usage.strip()) // 1000


def nice_weight(nice: int) -> int:
    """The CPU weight of a nice level, as the scheduler gives one process (v1 ``cpu.shares``)."""
    return NICE_WEIGHTS[max(0, min(19, nice))]


def v2_weight(shares: int) -> int:
    """cgroup v2 ``cpu.weight`` (1..10000, 100 = a nice-0 process) of v1 ``cpu.shares``
    (1024 = a nice-0 process), as the kernel and the container runtimes convert it."""
    return max(1, min(10_000, round(shares * 100 / 1024)))


@dataclass(frozen=True)
class Sample:
    """A slice's usage counter read at ``t_s`` (monotonic seconds). ``life`` numbers the
    processes the slice has held (a replica lent again is a new life); only samples taken
    while the replica served its lent capacity (``lent``) are counted."""

    worker_id: str
    life: int
    t_s: float
    usage_usec: int
    cores: float
    lent: bool


@dataclass(frozen=True)
class BusyShare:
    """CPU time the slices used over the quota time they were lent, and per replica."""

    used_s: float
    quota_s: float
    by_replica: dict[str, float] = field(default_factory=dict)

    @property
    def share(self) -> float | None:
        return self.used_s / self.quota_s if self.quota_s > 0 else None


def busy_share(samples: Iterable[Sample]) -> BusyShare:
    """Busy share of the slices while lent: over each pair of consecutive samples of one
    replica's life, both taken while lent, the CPU time used (the usage counter's increase)
    over the slice's quota time (cores x the seconds between them). A pair that spans a
    restart (another life) or an unlent stretch (starting up, reclaimed) is left out, so
    neither the model's load and warm-up nor the drain after a reclaim counts either way."""
    last: dict[str, Sample] = {}
    used: dict[str, float] = {}
    quota: dict[str, float] = {}
    for s in sorted(samples, key=lambda s: (s.worker_id, s.life, s.t_s)):
        prev = last.get(s.worker_id)
        last[s.worker_id] = s
        if prev is None or prev.life != s.life or not (prev.lent and s.lent):
            continue
        dt = s.t_s - prev.t_s
        if dt <= 0:
            continue
        used[s.worker_id] = used.get(s.worker_id, 0.0) + max(
            0, s.usage_usec - prev.usage_usec) / 1e6
        quota[s.worker_id] = quota.get(s.worker_id, 0.0) + prev.cores * dt
    by = {w: used[w] / quota[w] for w in sorted(quota) if quota[w] > 0}
    return BusyShare(sum(used.values()), sum(quota.values()), by)


# -- I/O: making slices ----------------------------------------------------------------------

@dataclass
class Slice:
    """One replica's cgroup (one directory per hierarchy that holds a controller it needs)."""

    worker_id: str
    quota: Quota
    version: int
    dirs: list[Path]
    usage_file: Path

    def enter(self) -> None:
        """Move the calling process into the slice (run in the child between fork and exec,
        so everything the replica ever does, its start-up included, is inside it)."""
        pid = str(os.getpid())
        for d in self.dirs:
            (d / "cgroup.procs").write_text(pid)

    def usage_usec(self) -> int:
        text = self.usage_file.read_text()
        return usage_usec_v2(text) if self.version == 2 else usage_usec_v1(text)


@dataclass
class CpuSlices:
    """The run's slices: a group per hierarchy under the demo's own cgroup, a slice per
    opportunistic replica in it. ``version`` 0 means none can be made (``reason`` says why)."""

    version: int
    reason: str = ""
    roots: list[Path] = field(default_factory=list)
    usage_root: Path | None = None
    slices: dict[str, Slice] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        return {1: "cgroup-v1", 2: "cgroup-v2"}.get(self.version, "none")

    @classmethod
    def open(cls, name: str, proc: Path = Path("/proc/self")) -> CpuSlices:
        """The slices of a run named ``name`` (a directory under this process's cgroup), or
        one with ``version`` 0 and the reason none can be made here."""
        try:
            mounts = parse_mountinfo((proc / "mountinfo").read_text())
            own = parse_proc_cgroup((proc / "cgroup").read_text())
        except OSError as exc:
            return cls(0, f"cannot read this process's cgroups: {exc}")
        v2 = next((m for m in mounts if m.fstype == "cgroup2"), None)
        if v2 is not None and "cpu" in _words(Path(v2.point) / "cgroup.controllers"):
            return cls._open_v2(Path(v2.point), own.get("", "/"), name)
        cpu = next((m for m in mounts if m.fstype == "cgroup" and "cpu" in m.options), None)
        acct = next((m for m in mounts if m.fstype == "cgroup" and "cpuacct" in m.options), None)
        if cpu is not None and acct is not None:
            return cls._open_v1(cpu, acct, own, name)
        return cls(0, "no cgroup hierarchy with the cpu controller is mounted "
                      "(neither cgroup v2 with cpu nor v1 cpu and cpuacct)")

    @classmethod
    def _open_v2(cls, mount: Path, own: str, name: str) -> CpuSlices:
        parent = mount / own.lstrip("/")
        try:
            if "cpu" not in _words(parent / "cgroup.subtree_control"):
                (parent / "cgroup.subtree_control").write_text("+cpu")
            root = parent / name
            root.mkdir(exist_ok=True)
            (root / "cgroup.subtree_control").write_text("+cpu")
        except OSError as exc:
            why = _why(exc)
            if exc.errno == errno.EBUSY:
                why += (" (cgroup v2 lets a group that holds processes enable no controller for "
                        "its children: run the demo in a cgroup of its own, e.g. systemd-run "
                        "--scope -p Delegate=yes)")
            return cls(0, f"cgroup v2 at {parent}: cannot enable the cpu controller: {why}")
        return cls(2, roots=[root], usage_root=root)

    @classmethod
    def _open_v1(cls, cpu: Mount, acct: Mount, own: dict[str, str], name: str) -> CpuSlices:
        roots = []
        try:
            for mount, key in ((cpu, "cpu"), (acct, "cpuacct")):
                root = Path(mount.point) / own.get(key, "/").lstrip("/") / name
                if root not in roots:
                    root.mkdir(exist_ok=True)
                    roots.append(root)
        except OSError as exc:
            for root in roots:
                with contextlib.suppress(OSError):
                    root.rmdir()
            return cls(0, f"cgroup v1: cannot create {name} under {cpu.point}: {_why(exc)}")
        return cls(1, roots=roots, usage_root=roots[-1])

    def make(self, worker_id: str, quota: Quota, weight: int = 1024) -> Slice:
        """The slice of one replica (made once; a replica lent again reuses it), with its
        quota and its CPU weight (``cpu.shares`` units, 1024 = a nice-0 process)."""
        if worker_id in self.slices:
            return self.slices[worker_id]
        if self.version == 0 or self.usage_root is None:
            raise SliceError(f"no CPU slices here: {self.reason}")
        dirs = [root / worker_id for root in self.roots]
        try:
            for d in dirs:
                d.mkdir(exist_ok=True)
            cpu = dirs[0]
            if self.version == 2:
                (cpu / "cpu.max").write_text(quota.cpu_max())
                (cpu / "cpu.weight").write_text(str(v2_weight(weight)))
                usage = cpu / "cpu.stat"
            else:
                (cpu / "cpu.cfs_period_us").write_text(str(quota.period_us))
                (cpu / "cpu.cfs_quota_us").write_text(str(quota.quota_us))
                (cpu / "cpu.shares").write_text(str(max(2, weight)))
                usage = self.usage_root / worker_id / "cpuacct.usage"
        except OSError as exc:
            raise SliceError(f"CPU slice of {worker_id} in {dirs[0]}: {_why(exc)}") from None
        made = Slice(worker_id, quota, self.version, dirs, usage)
        self.slices[worker_id] = made
        self._weigh_group()
        return made

    def _weigh_group(self) -> None:
        """The run's group weighs what its slices do together, so each slice competes for a
        contended CPU as one process of its weight would (not its share of one process)."""
        total = sum(int(_read(d / ("cpu.weight" if self.version == 2 else "cpu.shares")) or 0)
                    for s in self.slices.values() for d in s.dirs[:1])
        if not total:
            return
        with contextlib.suppress(OSError):
            if self.version == 2:
                (self.roots[0] / "cpu.weight").write_text(str(max(1, min(10_000, total))))
            else:
                (self.roots[0] / "cpu.shares").write_text(str(max(2, total)))

    def close(self) -> list[str]:
        """Remove the run's cgroups (each must be empty: call once its replicas have exited);
        returns those that could not be removed, with why."""
        left = []
        for s in self.slices.values():
            for d in s.dirs:
                if not _rmdir(d):
                    left.append(str(d))
        for root in self.roots:
            if not _rmdir(root):
                left.append(str(root))
        return left


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _words(path: Path) -> set[str]:
    return set((_read(path) or "").split())


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _why(exc: OSError) -> str:
    return f"{exc.strerror or exc} ({getattr(exc, 'filename', '') or ''})".replace(" ()", "")
