"""What the kernel says about a cgroup's CPU: the quota files and where a process's cgroup is
(pure parsing; the callers read the files).

Two users: the demo writes CPU slices for its opportunistic replicas (``surplus.demo.slices``)
and the capacity agent reads the slice it lends (``workers.capacity.platform``). Both
hierarchies are parsed because both are what a machine has: cgroup v2 (``cpu.max``: ``"quota
period"`` or ``"max period"``) and v1 (``cpu.cfs_quota_us``, -1 for none, over
``cpu.cfs_period_us``), which hybrid hosts still mount for the cpu controller.

Where a process's cgroup is comes from two files: ``/proc/self/mountinfo`` (each cgroup mount,
the subtree it shows and, for v1, the controllers it holds) and ``/proc/self/cgroup`` (the
process's path per hierarchy). In a container with its own cgroup namespace both say ``/`` and
the mount is the container's cgroup; on a host, or a v1 container without one, the path is
long and the mount may show a subtree of it (``root``), which ``cgroup_dir`` takes off.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Quota:
    """A CPU quota: ``quota_us`` of CPU time in every ``period_us`` of wall time."""

    quota_us: int
    period_us: int

    @property
    def cores(self) -> float:
        return self.quota_us / self.period_us

    def cpu_max(self) -> str:
        """The line cgroup v2's ``cpu.max`` takes."""
        return f"{self.quota_us} {self.period_us}"


def parse_cpu_max(text: str) -> Quota | None:
    """cgroup v2 ``cpu.max`` (``"50000 100000"``, or ``"max 100000"``: no limit -> None)."""
    parts = text.split()
    if len(parts) != 2:
        raise ValueError(f"cpu.max should hold 'quota period', got {text!r}")
    if parts[0] == "max":
        return None
    return _quota(parts[0], parts[1], "cpu.max")


def parse_cfs(quota_us: str, period_us: str) -> Quota | None:
    """cgroup v1 ``cpu.cfs_quota_us`` (-1: no limit -> None) over ``cpu.cfs_period_us``."""
    if quota_us.strip() == "-1":
        return None
    return _quota(quota_us.strip(), period_us.strip(), "cpu.cfs_quota_us/cpu.cfs_period_us")


def _quota(quota: str, period: str, where: str) -> Quota:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        raise ValueError(f"{where}: {quota!r} over {period!r} is not a quota in "
                         "microseconds") from None
    if q <= 0 or p <= 0:
        raise ValueError(f"{where}: quota {q} over period {p} us must both be positive")
    return Quota(q, p)


def tightest(quotas: Iterable[Quota | None]) -> Quota | None:
    """The quota that binds: a cgroup can use no more than its own quota nor any ancestor's,
    so the smallest in cores (None: no limit anywhere)."""
    limits = [q for q in quotas if q is not None]
    return min(limits, key=lambda q: q.cores) if limits else None


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    options: frozenset[str]
    root: str = "/"
    """The cgroup the mount shows at ``point`` (``/`` unless a subtree is bind-mounted)."""


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup mounts of ``/proc/self/mountinfo`` (v1 ``cgroup`` and v2 ``cgroup2``), with
    their super options (where v1 names its controllers)."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields_ = left.split()
        fstype, _source, *opts = right.split()
        if fstype not in ("cgroup", "cgroup2") or len(fields_) < 5:
            continue
        options = frozenset(",".join([fields_[5] if len(fields_) > 5 else "", *opts])
                            .split(","))
        out.append(Mount(fields_[4], fstype, options - {""}, fields_[3]))
    return out


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` as controller -> path; the v2 hierarchy's key is ``""``."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for name in (controllers.split(",") if controllers else [""]):
            out[name.removeprefix("name=")] = path
    return out


@dataclass(frozen=True)
class CpuCgroup:
    """Where a process's CPU quota is: the hierarchy's ``version`` and its cgroup directory,
    with the directories above it up to the mount (``ancestors``, nearest first)."""

    version: int
    path: str
    ancestors: tuple[str, ...] = ()


def cpu_cgroup(mounts: list[Mount], own: dict[str, str]) -> CpuCgroup | None:
    """The cgroup directory that holds this process's CPU quota: the v1 ``cpu`` hierarchy's
    where one is mounted (a controller binds to one hierarchy only, so on a hybrid host the
    unified one then has no cpu), else the v2 one (None: neither is mounted)."""
    v1 = next((m for m in mounts if m.fstype == "cgroup" and "cpu" in m.options), None)
    if v1 is not None and "cpu" in own:
        return _located(1, v1, own["cpu"])
    v2 = next((m for m in mounts if m.fstype == "cgroup2"), None)
    if v2 is not None and "" in own:
        return _located(2, v2, own[""])
    return None


def _located(version: int, mount: Mount, path: str) -> CpuCgroup:
    """The directory of ``path`` under ``mount`` (the part the mount shows taken off; a path
    outside it, as another namespace sees it, is the mount's own directory)."""
    root = mount.root.rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    elif root:
        path = "/"
    rel = posixpath.normpath("/" + path.lstrip("/")).lstrip("/")
    here = posixpath.join(mount.point, rel) if rel else mount.point
    ancestors = []
    parts = rel.split("/") if rel else []
    while parts:
        parts.pop()
        ancestors.append(posixpath.join(mount.point, *parts) if parts else mount.point)
    return CpuCgroup(version, here, tuple(ancestors))
