"""A replica scores on the hardware its pool lends (``workers.runtime.devices``): the device
follows the pool's accelerator, and a mismatch stops the worker at start, naming the keys."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.unit.runtime.tiny import TINY
from workers.runtime.config import ConfigError, load_config
from workers.runtime.devices import DeviceMismatch, device_for_pool, stand_in_device
from workers.runtime.models import ModelLoadError, ModelSpec, build_reference, export_onnx
from workers.runtime.served_model import device_type, load_served

H100 = "NVIDIA H100 80GB HBM3"


def test_a_cpu_pool_scores_on_the_cpu_even_where_a_gpu_is_visible() -> None:
    assert device_for_pool("cpu", "auto", H100) == "cpu"
    assert device_for_pool("CPU", "cpu", None) == "cpu"


def test_a_gpu_pool_scores_on_cuda_when_its_gpu_model_is_the_one_seen() -> None:
    assert device_for_pool("h100", "auto", H100) == "cuda"
    assert device_for_pool("a10g", "cuda", "NVIDIA A10G") == "cuda"
    assert device_for_pool("l4", "auto", "NVIDIA L4") == "cuda"


def test_a_gpu_name_the_platform_does_not_know_takes_any_cuda_device() -> None:
    assert device_for_pool("gpu", "auto", H100) == "cuda"


@pytest.mark.parametrize(("accelerator", "choice", "seen", "names"), [
    ("cpu", "cuda", H100, ("`model.device` is cuda", "`accelerator` is cpu")),
    ("l4", "cpu", "NVIDIA L4", ("`model.device` is cpu", "`accelerator` is l4")),
    ("a100", "auto", None, ("`accelerator` is a100", "no CUDA device")),
    ("l4", "auto", H100, ("`accelerator` is l4", H100, "Set `accelerator` to h100")),
    ("a10", "auto", "NVIDIA A100-SXM4-80GB", ("`accelerator` is a10", "to a100")),
])
def test_hardware_the_pool_does_not_lend_is_refused_naming_the_keys(
        accelerator: str, choice: str, seen: str | None, names: tuple[str, ...]) -> None:
    with pytest.raises(DeviceMismatch) as refused:
        device_for_pool(accelerator, choice, seen)
    for name in names:
        assert name in str(refused.value)


def test_a_worker_of_a_gpu_pool_on_this_cpu_machine_does_not_load_its_model() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the refusal needs one without")
    with pytest.raises(ModelLoadError, match=r"bad worker config: .*`accelerator` is l4"):
        asyncio.run(load_served(ModelSpec(name="baseline", config=TINY), "l4"))


def test_a_worker_of_a_cpu_pool_loads_on_the_cpu() -> None:
    loaded = asyncio.run(load_served(ModelSpec(name="baseline", config=TINY), "cpu"))
    assert device_type(loaded) == "cpu"


def test_a_model_built_for_both_devices_loads_the_file_for_its_pools(tmp_path: Path) -> None:
    onnx = export_onnx(build_reference("baseline", TINY), TINY, tmp_path / "ranker.onnx")
    spec = ModelSpec(name="baseline", config=TINY,
                     artifacts={"cpu": str(onnx), "cuda": str(tmp_path / "ranker.pt2")})
    loaded = asyncio.run(load_served(spec, "cpu"))
    assert loaded.source == str(onnx)


def test_a_model_with_files_for_other_devices_only_is_refused_naming_the_key() -> None:
    spec = ModelSpec(name="baseline", config=TINY, artifacts={"cuda": "ranker.pt2"})
    with pytest.raises(ModelLoadError, match=r"`model.artifacts`: no file for cpu,.*has cuda"):
        asyncio.run(load_served(spec, "cpu"))


def test_a_missing_artifact_stops_the_worker_at_start_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"`model.artifacts.cuda`: model file .* not exist"):
        load_config(None, {"worker_id": "w1",
                           "model.artifacts": {"cuda": str(tmp_path / "gone.pt2")}})


def test_a_replica_standing_in_for_its_pools_accelerator_follows_model_device_alone() -> None:
    assert stand_in_device("cpu", H100) == "cpu"
    assert stand_in_device("auto", None) == "cpu"
    assert stand_in_device("auto", H100) == "cuda"
    spec = ModelSpec(name="baseline", config=TINY, device="cpu")
    loaded = asyncio.run(load_served(spec, "a100", stand_in=True))
    assert device_type(loaded) == "cpu"
