"""What a replica lends, from what its platform says: the pool from labels, the instance type
and the lifecycle; CPU units from the quota; GPUs from the devices it sees; configured units
only as caps, or as the count where no GPU is visible."""

from __future__ import annotations

import pytest

from workers.capacity.cgroup import Quota
from workers.capacity.platform import (
    Identity,
    PlatformError,
    View,
    Wanted,
    count_gpus,
    family_accelerator,
    gpu_model,
    identify,
    parse_labels,
    share,
)

EKS_SPOT = {"topology.kubernetes.io/region": "eu-west-1", "karpenter.sh/capacity-type": "spot",
            "node.kubernetes.io/instance-type": "g5.2xlarge"}


def test_a_spot_node_labelled_by_karpenter_is_an_opportunistic_pool_of_its_gpu() -> None:
    ident = identify(Wanted(model="powerful"), View(labels=EKS_SPOT))
    assert ident.pool_id == "eu-west-1/rank/powerful/a10g/opportunistic" and ident.lends


def test_the_ec2_metadata_names_region_type_and_lifecycle_where_no_label_does() -> None:
    view = View(instance_type="p4d.24xlarge", lifecycle="spot", cloud_region="us-east-1")
    assert identify(Wanted(), view).pool_id == "us-east-1/rank/baseline/a100/opportunistic"
    on_demand = View(instance_type="m5.xlarge", lifecycle="on-demand", cloud_region="us-east-1")
    assert identify(Wanted(), on_demand) == Identity(
        region="us-east-1", service="rank", model="baseline", accelerator="cpu", tier="baseline")


def test_flags_then_surplus_labels_win_over_what_is_inferred() -> None:
    labels = {**EKS_SPOT, "surplus.io/region": "eu1", "surplus.io/accelerator": "a10"}
    assert identify(Wanted(), View(labels=labels)).pool_id == "eu1/rank/baseline/a10/opportunistic"
    wanted = Wanted.from_pool("eu2/ads/baseline/cpu/opportunistic")
    assert identify(wanted, View(labels=labels)).pool_id == "eu2/ads/baseline/cpu/opportunistic"
    assert identify(Wanted(tier="baseline"), View(labels=labels)).tier == "baseline"


@pytest.mark.parametrize("labels", [{"cloud.google.com/gke-spot": "true"},
                                    {"cloud.google.com/gke-preemptible": "true"},
                                    {"eks.amazonaws.com/capacityType": "SPOT"},
                                    {"kubernetes.azure.com/scalesetpriority": "spot"}])
def test_every_providers_spot_label_makes_the_replica_lend(labels: dict[str, str]) -> None:
    assert identify(Wanted(region="r"), View(labels=labels)).tier == "opportunistic"


def test_a_pool_that_cannot_be_named_stops_naming_the_setting_to_give() -> None:
    with pytest.raises(PlatformError, match="--region"):
        identify(Wanted(), View())
    with pytest.raises(PlatformError, match="--accelerator"):
        identify(Wanted(region="eu1"), View(gpus=2))        # GPUs of no known type
    with pytest.raises(PlatformError, match="pool id"):
        Wanted.from_pool("eu1/rank/baseline")
    with pytest.raises(PlatformError, match="tier"):
        identify(Wanted(region="eu1", tier="spot"), View())


@pytest.mark.parametrize("product, model", [
    ("NVIDIA-A100-SXM4-80GB", "a100"), ("nvidia-tesla-a100", "a100"), ("nvidia-l4", "l4"),
    ("NVIDIA-A10G", "a10g"), ("NVIDIA-L40S", "l40s"), ("nvidia-h100-80gb", "h100"),
    ("Tesla-T4", "t4"), ("", None), ("nvidia-mystery", None)])
def test_gpu_product_strings_name_the_model(product: str, model: str | None) -> None:
    assert gpu_model(product) == model


@pytest.mark.parametrize("instance, accelerator", [
    ("g5.xlarge", "a10g"), ("p5.48xlarge", "h100"), ("p5e.48xlarge", "h200"),
    ("g4dn.xlarge", "t4"), ("a2-highgpu-1g", "a100"), ("m5.large", None), ("c7g.4xlarge", None)])
def test_the_instance_family_names_its_accelerator(instance: str, accelerator: str | None) -> None:
    assert family_accelerator(instance) == accelerator


def test_cpu_units_are_the_quotas_cores_capped_by_configuration() -> None:
    wanted = Wanted(region="eu1", tier="opportunistic")
    lent = share(wanted, View(quota=Quota(50_000, 100_000), cpus=16))
    assert (lent.cpu_units, lent.accelerator_units) == (0.5, 1.0)    # a CPU replica: one unit
    assert "cgroup quota 50000 100000" in lent.sources["cpu"]
    assert share(wanted, View(cpus=16)).cpu_units == 16.0               # no quota: its CPUs
    capped = share(Wanted(region="eu1", cpu_units=4.0), View(cpus=16))
    assert capped.cpu_units == 4.0 and "capped" in capped.sources["cpu"]
    assert share(Wanted(region="eu1", cpu_units=4.0), View(quota=Quota(1, 1))).cpu_units == 1.0


def test_gpus_seen_are_counted_and_configuration_only_caps_or_stands_in() -> None:
    a100 = Wanted(region="eu1", accelerator="a100")
    assert share(a100, View(gpus=4)).accelerator_units == 4.0
    capped = Wanted(region="eu1", accelerator="a100", accelerator_units=2.0)
    assert share(capped, View(gpus=4)).accelerator_units == 2.0
    sidecar = share(capped, View(gpus=0))                     # sees none of the worker's
    assert sidecar.accelerator_units == 2.0 and "no GPU visible" in sidecar.sources["accelerator"]
    with pytest.raises(PlatformError, match="--accelerator-units"):
        share(Wanted(region="eu1", accelerator="a100", tier="opportunistic"), View(gpus=0))
    baseline = share(Wanted(region="eu1", accelerator="a100", tier="baseline"), View(gpus=0))
    assert baseline.accelerator_units == 0.0 and not baseline.identity.lends


def test_devices_are_narrowed_by_the_runtime_and_by_cuda() -> None:
    dev = ["nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm", "null"]
    assert count_gpus(dev, {}) == 3
    assert count_gpus(dev, {"NVIDIA_VISIBLE_DEVICES": "all"}) == 3
    assert count_gpus(dev, {"NVIDIA_VISIBLE_DEVICES": "GPU-1a,GPU-2b"}) == 2
    assert count_gpus(dev, {"NVIDIA_VISIBLE_DEVICES": "void"}) == 0
    assert count_gpus(dev, {"CUDA_VISIBLE_DEVICES": "1"}) == 1
    assert count_gpus(dev, {"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert count_gpus(dev, {"CUDA_VISIBLE_DEVICES": "0,-1,2"}) == 1   # CUDA stops at -1
    assert count_gpus(["null"], {"CUDA_VISIBLE_DEVICES": "0,1"}) == 0  # no device, no GPU


def test_downward_api_labels_files_are_read_with_go_quoting() -> None:
    text = ('app="worker"\ntopology.kubernetes.io/region="eu-west-1"\n'
            'note="a \\"quoted\\" \\u00e9 value"\n\n')
    assert parse_labels(text) == {"app": "worker", "topology.kubernetes.io/region": "eu-west-1",
                                  "note": 'a "quoted" é value'}
    with pytest.raises(ValueError, match="line 1"):
        parse_labels("no equals sign\n")
    with pytest.raises(ValueError, match="line 2"):
        parse_labels('a="b"\nc="unterminated\n')
