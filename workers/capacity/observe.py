"""Reads what the platform says about the replica an agent lends (the I/O behind ``platform``).

Each read is cheap and done every tick, so a resized CPU quota or a relabelled pod is lent as
it is now: the cgroup's quota files, ``/dev``, the process's environment and the mounted
labels files. The EC2 metadata (instance type, lifecycle, region) does not change while the
instance lives, so each of its documents is read until it answers once, then kept.

A read that fails is no figure (the quota unknown, a labels file skipped), recorded in
``problems`` by what failed, for the agent to log once; ``platform`` decides what the figures
that remain make.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from workers.capacity import cgroup
from workers.capacity.cgroup import Quota
from workers.capacity.imds import Imds, ImdsError
from workers.capacity.platform import View, count_gpus, kubelet_quota, parse_labels

INSTANCE_TYPE = "/latest/meta-data/instance-type"
LIFECYCLE = "/latest/meta-data/instance-life-cycle"
REGION = "/latest/meta-data/placement/region"
IMDS_FACTS = (INSTANCE_TYPE, LIFECYCLE, REGION)


def read_quota(directory: Path, version: int | None = None) -> Quota | None:
    """The CPU quota of one cgroup directory (None: no limit): v2 ``cpu.max`` (a v2 cgroup
    without the cpu controller has none, and no limit of its own), v1's cfs files, or with
    ``version`` None whichever is there, a v1 cgroupfs root's ``cpu`` hierarchy included
    (another container's ``/proc/<pid>/root/sys/fs/cgroup``, whatever the host's cgroups).
    OSError or ValueError when it cannot be read."""
    cpu_max = directory / "cpu.max"
    if version == 2 or (version is None and cpu_max.exists()):
        if version == 2 and not cpu_max.exists():
            if not directory.is_dir():
                raise FileNotFoundError(f"no cgroup directory {directory}")
            return None
        return cgroup.parse_cpu_max(cpu_max.read_text())
    if version is None and not (directory / "cpu.cfs_quota_us").exists():
        # a v1 cgroupfs root (a container's /sys/fs/cgroup): the cpu hierarchy's directory
        below = [directory / d for d in ("cpu", "cpu,cpuacct", "cpuacct,cpu")
                 if (directory / d / "cpu.cfs_quota_us").exists()]
        if below:
            directory = below[0]
    return cgroup.parse_cfs((directory / "cpu.cfs_quota_us").read_text(),
                            (directory / "cpu.cfs_period_us").read_text())


def own_quota(proc: Path = Path("/proc/self")) -> Quota | None:
    """The tightest CPU quota over this process's cgroup and the cgroups above it that its
    mount shows (a parent's quota binds its children: a Kubernetes pod's, a systemd slice's).
    OSError or ValueError when the process's cgroup cannot be found or read."""
    where = cgroup.cpu_cgroup(cgroup.parse_mountinfo((proc / "mountinfo").read_text()),
                              cgroup.parse_proc_cgroup((proc / "cgroup").read_text()))
    if where is None:
        raise ValueError("no cgroup hierarchy with the cpu controller is mounted")
    quotas = [read_quota(Path(where.path), where.version)]
    for above in where.ancestors:
        try:
            quotas.append(read_quota(Path(above), where.version))
        except (OSError, ValueError):
            break  # the top of what this namespace shows (a root cgroup has no cpu.max)
    return cgroup.tightest(quotas)


class PlatformReader:
    """Reads a ``platform.View``: the quota of ``cgroup_dir``, else the CPU limit in
    ``cpu_limit_file`` (a downward-API file), else this process's own cgroup's; the
    GPUs under ``dev`` as ``env`` narrows them, the labels files then ``labels`` (the flags
    win), and, with ``imds``, the instance's metadata."""

    def __init__(self, *, imds: Imds | None = None, cgroup_dir: Path | None = None,
                 cpu_limit_file: Path | None = None,
                 labels_files: tuple[Path, ...] = (), labels: Mapping[str, str] | None = None,
                 proc: Path = Path("/proc/self"), dev: Path = Path("/dev"),
                 env: Mapping[str, str] | None = None) -> None:
        self.imds = imds
        self.cgroup_dir = cgroup_dir
        self.cpu_limit_file = cpu_limit_file
        self.labels_files = labels_files
        self.labels = dict(labels or {})
        self.proc = proc
        self.dev = dev
        self.env = os.environ if env is None else env
        self.facts: dict[str, str | None] = {}
        """Metadata documents read so far (None: the service says there is none)."""
        self.problems: dict[str, str] = {}

    @property
    def imds_pending(self) -> bool:
        """The metadata service is to be read and some document has not answered yet."""
        return self.imds is not None and any(p not in self.facts for p in IMDS_FACTS)

    def view(self) -> View:
        self.problems = {}
        return View(labels=self._labels(), instance_type=self._fact(INSTANCE_TYPE),
                    lifecycle=self._fact(LIFECYCLE), cloud_region=self._fact(REGION),
                    quota=self._quota(), quota_source=self._quota_source(), cpus=_cpus(),
                    gpus=self._gpus())

    def _quota_source(self) -> str:
        if self.cgroup_dir is None and self.cpu_limit_file is not None:
            return "the worker's CPU limit"
        return "cgroup quota"

    def _quota(self) -> Quota | None:
        try:
            if self.cgroup_dir is not None:
                return read_quota(self.cgroup_dir)
            if self.cpu_limit_file is not None:
                return kubelet_quota(self.cpu_limit_file.read_text())
            return own_quota(self.proc)
        except (OSError, ValueError) as exc:
            where = self.cgroup_dir or self.cpu_limit_file or "this process's cgroup"
            self.problems["cgroup"] = (f"CPU quota of {where} unreadable ({exc}): lending the "
                                       "CPUs it may run on")
            return None

    def _gpus(self) -> int:
        try:
            names = os.listdir(self.dev)
        except OSError as exc:
            self.problems["devices"] = f"cannot list {self.dev} ({exc}): no GPU counted"
            names = []
        return count_gpus(names, self.env)

    def _labels(self) -> dict[str, str]:
        merged: dict[str, str] = {}
        for path in self.labels_files:
            try:
                merged.update(parse_labels(path.read_text()))
            except (OSError, ValueError) as exc:
                self.problems[f"labels:{path}"] = f"labels file {path} skipped: {exc}"
        return {**merged, **self.labels}

    def _fact(self, path: str) -> str | None:
        if self.imds is None:
            return None
        if path not in self.facts:
            try:
                body = self.imds.get(path)
            except ImdsError as exc:
                self.problems[f"imds:{path}"] = f"{path} not read yet: {exc}"
                return None
            self.facts[path] = body.decode("utf-8", errors="replace").strip() \
                if body is not None else None
        return self.facts[path]


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
