"""Reading the platform on fake trees: the quota of a cgroup and of the cgroups above it, the
GPUs in a /dev, labels files under the flags, and the EC2 metadata read until it answers."""

from __future__ import annotations

from pathlib import Path

from workers.capacity.cgroup import Quota
from workers.capacity.imds import ImdsError
from workers.capacity.observe import (
    INSTANCE_TYPE,
    LIFECYCLE,
    REGION,
    PlatformReader,
    own_quota,
    read_quota,
)


def _v2_tree(tmp: Path, path: str, quotas: dict[str, str]) -> Path:
    """A cgroup2 mount at tmp/cg holding ``path``, each directory's cpu.max from ``quotas``;
    returns the fake /proc/self."""
    root = tmp / "cg"
    (root / path.lstrip("/")).mkdir(parents=True)
    for rel, line in quotas.items():
        (root / rel.lstrip("/") / "cpu.max").write_text(line + "\n")
    proc = tmp / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(f"30 20 0:26 / {root} rw - cgroup2 cgroup2 rw\n")
    (proc / "cgroup").write_text(f"0::{path}\n")
    return proc


def test_a_cgroups_own_quota_in_either_hierarchy(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert read_quota(tmp_path) == Quota(50_000, 100_000)
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert read_quota(v1) is None
    assert read_quota(v1, version=2) is None     # a v2 cgroup without the cpu controller
    root = tmp_path / "v1root"                    # a container's /sys/fs/cgroup on a v1 host
    (root / "cpu,cpuacct").mkdir(parents=True)
    (root / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("50000\n")
    (root / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    assert read_quota(root) == Quota(50_000, 100_000)


def test_a_parents_quota_binds_a_child_without_one(tmp_path: Path) -> None:
    proc = _v2_tree(tmp_path, "/kubepods/pod1/c1",
                    {"/kubepods": "max 100000", "/kubepods/pod1": "150000 100000",
                     "/kubepods/pod1/c1": "max 100000"})
    assert own_quota(proc) == Quota(150_000, 100_000)


def test_the_childs_tighter_quota_binds(tmp_path: Path) -> None:
    proc = _v2_tree(tmp_path, "/slice/c1", {"/slice": "400000 100000", "/slice/c1": "5000 10000"})
    assert own_quota(proc) == Quota(5_000, 10_000)


def test_the_reader_sees_quota_gpus_and_labels_the_flags_over_the_files(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (dev / name).touch()
    labels = tmp_path / "labels"
    labels.write_text('topology.kubernetes.io/region="eu-west-1"\nkarpenter.sh/capacity-type='
                      '"on-demand"\n')
    reader = PlatformReader(cgroup_dir=tmp_path, labels_files=(labels,), dev=dev,
                            labels={"karpenter.sh/capacity-type": "spot"},
                            env={"CUDA_VISIBLE_DEVICES": "0"})
    view = reader.view()
    assert view.quota == Quota(200_000, 100_000) and view.gpus == 1
    assert view.labels == {"topology.kubernetes.io/region": "eu-west-1",
                           "karpenter.sh/capacity-type": "spot"}
    assert reader.problems == {}


def test_what_cannot_be_read_is_a_problem_and_no_figure(tmp_path: Path) -> None:
    bad = tmp_path / "labels"
    bad.write_text("garbage\n")
    reader = PlatformReader(cgroup_dir=tmp_path / "gone", labels_files=(bad,),
                            dev=tmp_path / "nodev", env={})
    view = reader.view()
    assert (view.quota, view.gpus, dict(view.labels)) == (None, 0, {})
    assert set(reader.problems) == {"cgroup", "devices", f"labels:{bad}"}
    assert "lending the CPUs it may run on" in reader.problems["cgroup"]


class FakeImds:
    def __init__(self) -> None:
        self.up = False
        self.reads: list[str] = []

    def get(self, path: str) -> bytes | None:
        self.reads.append(path)
        if not self.up:
            raise ImdsError("metadata service unreachable")
        return {INSTANCE_TYPE: b"g5.xlarge", LIFECYCLE: b"spot\n", REGION: b"eu-west-1"}[path]


def test_the_metadata_is_read_until_it_answers_then_kept(tmp_path: Path) -> None:
    imds = FakeImds()
    reader = PlatformReader(imds=imds, cgroup_dir=tmp_path, dev=tmp_path, env={})  # type: ignore[arg-type]
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert reader.view().instance_type is None and reader.imds_pending
    assert any(k.startswith("imds:") for k in reader.problems)
    imds.up = True
    view = reader.view()
    assert (view.instance_type, view.lifecycle, view.cloud_region) == \
        ("g5.xlarge", "spot", "eu-west-1")
    assert not reader.imds_pending
    before = len(imds.reads)
    reader.view()
    assert len(imds.reads) == before          # static documents: read once


def test_a_sidecar_handed_the_workers_cpu_limit_lends_what_the_kubelet_set(
        tmp_path: Path) -> None:
    limit = tmp_path / "worker-cpu-limit"
    limit.write_text("500\n")                      # limits.cpu 500m, divisor 1m
    view = PlatformReader(cpu_limit_file=limit, dev=tmp_path, env={}).view()
    assert view.quota == Quota(50_000, 100_000) and view.quota_source == "the worker's CPU limit"
    limit.write_text("half\n")
    reader = PlatformReader(cpu_limit_file=limit, dev=tmp_path, env={})
    assert reader.view().quota is None and "millicores" in reader.problems["cgroup"]
