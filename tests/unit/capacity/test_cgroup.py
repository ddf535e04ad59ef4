"""Reading what the kernel says about a cgroup's CPU: the quota files of both hierarchies, the
quota that binds, and where a process's cgroup is from mountinfo and /proc/self/cgroup."""

from __future__ import annotations

import pytest

from workers.capacity.cgroup import (
    CpuCgroup,
    Quota,
    cpu_cgroup,
    parse_cfs,
    parse_cpu_max,
    parse_mountinfo,
    parse_proc_cgroup,
    tightest,
)

V2_CONTAINER = "1062 1051 0:30 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw,nsdelegate\n"
HYBRID = """\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_SUBTREE = "40 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n"


def test_both_hierarchies_quota_files_read_as_cores_and_no_limit_as_none() -> None:
    assert parse_cpu_max("50000 100000\n") == Quota(50_000, 100_000)
    assert parse_cpu_max("max 100000") is None
    assert parse_cfs("150000\n", "100000\n") == Quota(150_000, 100_000)
    assert parse_cfs("-1\n", "100000\n") is None
    assert parse_cfs("150000", "100000").cores == 1.5  # type: ignore[union-attr]


@pytest.mark.parametrize("text", ["", "50000", "fifty 100000", "0 100000", "50000 -1"])
def test_a_quota_that_is_not_one_is_an_error_naming_the_file(text: str) -> None:
    with pytest.raises(ValueError, match=r"cpu\.max"):
        parse_cpu_max(text)


def test_the_tightest_quota_binds_and_none_anywhere_is_no_limit() -> None:
    assert tightest([Quota(400_000, 100_000), None, Quota(5_000, 10_000)]) == Quota(5_000, 10_000)
    assert tightest([None, None]) is None


def test_in_its_own_cgroup_namespace_a_container_reads_the_mount_itself() -> None:
    where = cpu_cgroup(parse_mountinfo(V2_CONTAINER), parse_proc_cgroup("0::/\n"))
    assert where == CpuCgroup(2, "/sys/fs/cgroup", ())


def test_on_a_host_the_cgroup_is_under_the_mount_with_its_ancestors_nearest_first() -> None:
    where = cpu_cgroup(parse_mountinfo(V2_CONTAINER),
                       parse_proc_cgroup("0::/kubepods.slice/pod1.slice/cri-a.scope\n"))
    assert where == CpuCgroup(2, "/sys/fs/cgroup/kubepods.slice/pod1.slice/cri-a.scope", (
        "/sys/fs/cgroup/kubepods.slice/pod1.slice", "/sys/fs/cgroup/kubepods.slice",
        "/sys/fs/cgroup"))


def test_a_hybrid_host_reads_the_v1_cpu_hierarchy_not_the_unified_one() -> None:
    own = parse_proc_cgroup("2:cpu:/user.slice\n1:cpuacct:/user.slice\n0::/user.slice\n")
    where = cpu_cgroup(parse_mountinfo(HYBRID), own)
    assert where is not None and (where.version, where.path) == (1, "/sys/fs/cgroup/cpu/user.slice")


def test_a_bind_mounted_subtree_takes_its_own_root_off_the_path() -> None:
    mounts = parse_mountinfo(V1_SUBTREE)
    assert mounts[0].root == "/docker/abc"
    where = cpu_cgroup(mounts, parse_proc_cgroup("4:cpu,cpuacct:/docker/abc\n"))
    assert where == CpuCgroup(1, "/sys/fs/cgroup/cpu,cpuacct", ())


def test_no_cpu_hierarchy_is_none() -> None:
    assert cpu_cgroup([], {"": "/"}) is None
