"""CPU slices of the demo's opportunistic replicas: the quota arithmetic, the parsing of what
the kernel says, the busy share, and the files a slice writes, on fake cgroup trees (no root,
no kernel: the same checks run on any machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from surplus.demo import slices
from surplus.demo.slices import CpuSlices, Quota, Sample, busy_share, quota_for


def test_a_quota_is_the_grants_cores_of_every_period() -> None:
    assert quota_for(0.5, 10_000) == Quota(5_000, 10_000)
    assert quota_for(0.5) == Quota(round(0.5 * slices.DEFAULT_PERIOD_US), slices.DEFAULT_PERIOD_US)
    assert quota_for(0.25, 100_000) == Quota(25_000, 100_000)
    assert quota_for(2.0).cores == 2.0
    assert Quota(5_000, 10_000).cpu_max() == "5000 10000"


def test_a_slice_under_the_kernels_1ms_minimum_gets_a_longer_period_not_more_cpu() -> None:
    q = quota_for(0.05, 10_000)  # 500 us in 10 ms is under the minimum
    assert q.quota_us >= slices.MIN_QUOTA_US
    assert q.cores == pytest.approx(0.05)


@pytest.mark.parametrize("cores", [0.0, -1.0, float("nan")])
def test_a_slice_needs_cores(cores: float) -> None:
    with pytest.raises(ValueError):
        quota_for(cores)


def test_parsing_what_the_kernel_says() -> None:
    assert slices.parse_cpu_max("max 100000\n") is None
    assert slices.parse_cpu_max("25000 100000\n") == Quota(25_000, 100_000)
    assert slices.usage_usec_v2("usage_usec 1234\nuser_usec 1000\nsystem_usec 234\n") == 1234
    assert slices.usage_usec_v1("2500000\n") == 2500
    with pytest.raises(ValueError):
        slices.usage_usec_v2("nr_periods 3\n")


def test_weights_follow_the_schedulers_nice_table() -> None:
    assert slices.nice_weight(0) == 1024 and slices.nice_weight(5) == 335
    assert slices.nice_weight(40) == 15
    assert slices.v2_weight(1024) == 100 and slices.v2_weight(335) == 33
    assert slices.v2_weight(1) == 1


MOUNTINFO_HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / {root}/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / {root}/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
41 31 0:38 / {root}/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_mountinfo_and_proc_cgroup() -> None:
    mounts = slices.parse_mountinfo(MOUNTINFO_HYBRID.format(root="/c"))
    assert [(m.point, m.fstype) for m in mounts] == [
        ("/c/cpu", "cgroup"), ("/c/cpuacct", "cgroup"), ("/c/unified", "cgroup2")]
    assert "cpu" in mounts[0].options and "cpuacct" in mounts[1].options
    own = slices.parse_proc_cgroup("2:cpu,cpuacct:/a\n1:name=systemd:/\n0::/user.slice/x\n")
    assert own == {"cpu": "/a", "cpuacct": "/a", "systemd": "/", "": "/user.slice/x"}


def _proc(tmp: Path, mountinfo: str, cgroup: str) -> Path:
    proc = tmp / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(mountinfo)
    (proc / "cgroup").write_text(cgroup)
    return proc


def test_v1_slices_set_the_cfs_quota_and_read_cpuacct(tmp_path: Path) -> None:
    for d in ("cpu", "cpuacct", "unified"):
        (tmp_path / d).mkdir()
    proc = _proc(tmp_path, MOUNTINFO_HYBRID.format(root=tmp_path), "3:cpu:/\n2:cpuacct:/\n0::/\n")
    cpu = CpuSlices.open("run", proc)
    assert cpu.mode == "cgroup-v1", cpu.reason
    made = cpu.make("w0", quota_for(0.25, 10_000), weight=335)
    leaf = tmp_path / "cpu" / "run" / "w0"
    assert (leaf / "cpu.cfs_quota_us").read_text() == "2500"
    assert (leaf / "cpu.cfs_period_us").read_text() == "10000"
    assert (leaf / "cpu.shares").read_text() == "335"
    # the run's group weighs what its slices do together
    assert (tmp_path / "cpu" / "run" / "cpu.shares").read_text() == "335"
    (tmp_path / "cpuacct" / "run" / "w0" / "cpuacct.usage").write_text("7000000\n")
    assert made.usage_usec() == 7000
    assert [d.parent.parent.name for d in made.dirs] == ["cpu", "cpuacct"]


def test_v2_slices_enable_cpu_and_set_cpu_max(tmp_path: Path) -> None:
    root = tmp_path / "unified"
    (root / "demo.scope").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "demo.scope" / "cgroup.subtree_control").write_text("")
    mountinfo = f"41 31 0:38 / {root} rw,relatime - cgroup2 cgroup2 rw\n"
    cpu = CpuSlices.open("run", _proc(tmp_path, mountinfo, "0::/demo.scope\n"))
    assert cpu.mode == "cgroup-v2", cpu.reason
    assert (root / "demo.scope" / "cgroup.subtree_control").read_text() == "+cpu"
    made = cpu.make("w0", quota_for(0.5, 10_000), weight=1024)
    leaf = root / "demo.scope" / "run" / "w0"
    assert (leaf / "cpu.max").read_text() == "5000 10000"
    assert (leaf / "cpu.weight").read_text() == "100"
    (leaf / "cpu.stat").write_text("usage_usec 42\nuser_usec 40\n")
    assert made.usage_usec() == 42
    assert cpu.make("w0", quota_for(1.0)) is made  # a replica lent again keeps its slice


def test_without_a_cpu_controller_there_are_no_slices_and_it_says_why(tmp_path: Path) -> None:
    root = tmp_path / "unified"
    root.mkdir()
    (root / "cgroup.controllers").write_text("memory pids\n")
    mountinfo = f"41 31 0:38 / {root} rw,relatime - cgroup2 cgroup2 rw\n"
    cpu = CpuSlices.open("run", _proc(tmp_path, mountinfo, "0::/\n"))
    assert cpu.mode == "none" and "cpu controller" in cpu.reason
    with pytest.raises(slices.SliceError, match="no CPU slices"):
        cpu.make("w0", quota_for(0.5))


def test_an_unwritable_hierarchy_means_no_slices_and_the_reason(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    cpu = CpuSlices.open("run", _proc(tmp_path, MOUNTINFO_HYBRID.format(root=missing),
                                      "3:cpu:/\n2:cpuacct:/\n"))
    assert cpu.mode == "none" and "cannot create" in cpu.reason


def _s(w: str, t: float, usage_s: float, *, life: int = 1, cores: float = 0.5,
       lent: bool = True) -> Sample:
    return Sample(w, life, t, round(usage_s * 1e6), cores, lent)


def test_busy_share_is_cpu_used_over_quota_time_while_lent() -> None:
    share = busy_share([
        _s("a", 0.0, 10.0, lent=False),  # starting up: the pair it begins is left out
        _s("a", 1.0, 10.4),              # ready: counted from here
        _s("a", 3.0, 11.2),              # 0.8 s of CPU in 2 s of a 0.5-core slice
        _s("b", 0.0, 0.0, cores=0.25),
        _s("b", 4.0, 1.0, cores=0.25),   # 1 s in 4 s of a 0.25-core slice: full
    ])
    assert share.quota_s == pytest.approx(0.5 * 2 + 0.25 * 4)
    assert share.used_s == pytest.approx(0.8 + 1.0)
    assert share.share == pytest.approx(1.8 / 2.0)
    assert share.by_replica == pytest.approx({"a": 0.8, "b": 1.0})


def test_busy_share_never_spans_a_restart_or_an_unlent_stretch() -> None:
    share = busy_share([
        _s("a", 0.0, 0.0), _s("a", 1.0, 0.5),
        _s("a", 2.0, 0.6, lent=False),            # reclaimed: the drain does not count
        _s("a", 9.0, 3.0, life=2, lent=False),    # lent again, still starting (model load)
        _s("a", 10.0, 3.5, life=2), _s("a", 11.0, 3.75, life=2),
    ])
    assert share.quota_s == pytest.approx(0.5 + 0.5)
    assert share.used_s == pytest.approx(0.5 + 0.25)


def test_no_lent_samples_no_share() -> None:
    assert busy_share([]).share is None
    assert busy_share([_s("a", 0.0, 0.0, lent=False), _s("a", 1.0, 1.0, lent=False)]).share is None


def test_the_summary_says_which_busy_share_it_gives_and_why() -> None:
    """With slices: the kernel's CPU time over quota time. Without: the replicas' reported
    busy time, and the summary says in words there were no slices and why."""
    from surplus.demo import report
    from tests.unit.demo.test_analysis import info

    samples = [(1.0, _s("a", 0.0, 0.0)), (2.0, _s("a", 2.0, 0.6))]
    run = info(slices={"mode": "cgroup-v1", "cores": {"a": 0.5}, "period_us": 5000})
    out = report._busy_share(run, samples, reported=0.1)
    assert out["opportunistic_busy_share_lent"] == 0.6
    assert "cgroup-v1" in out["opportunistic_busy_share_method"]
    run = info(slices={"mode": "none", "reason": "not root"})
    out = report._busy_share(run, samples, reported=0.1)
    assert out["opportunistic_busy_share_lent"] == 0.1
    assert out["opportunistic_busy_share_method"].startswith("NO CPU SLICES (not root)")
    assert out["cpu_slices"]["reason"] == "not root"
