"""The worker's CUDA path on a real GPU: models load and score there as on the CPU, exported
files load onto it, the batcher pays there, and a notice stops optional work while forward
passes run on the device.

Marked ``gpu`` and left out of ``make test`` (CI has no accelerator); ``make test-gpu`` runs
them, and fails rather than skips where no CUDA device is seen."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from workers.runtime.models import (
    ModelConfig,
    ModelName,
    ModelSpec,
    build_reference,
    example_inputs,
    export_model,
    load_model,
    trace_model,
)

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

SMALL = ModelConfig(num_dense=13, num_sparse=8, rows_per_table=1000, embedding_dim=16,
                    bottom_mlp=(64, 16), top_mlp=(64,), deep_mlp=(256, 128), cross_layers=2,
                    seed=3)
NAMES: list[ModelName] = ["baseline", "powerful"]


@pytest.fixture(autouse=True)
def _cuda() -> None:
    assert torch.cuda.is_available(), "no CUDA device: run these on a machine with a GPU"


@pytest.mark.parametrize("name", NAMES)
def test_reference_models_score_on_cuda_as_on_the_cpu(name: ModelName) -> None:
    on_gpu = load_model(ModelSpec(name=name, config=SMALL, device="cuda"))
    on_cpu = load_model(ModelSpec(name=name, config=SMALL, device="cpu"))
    assert on_gpu.device.type == "cuda"
    for rows in (1, 17, 512):
        dense, sparse = example_inputs(SMALL, rows, seed=rows)
        np.testing.assert_allclose(on_gpu.score(dense.numpy(), sparse.numpy()),
                                   on_cpu.score(dense.numpy(), sparse.numpy()),
                                   rtol=1e-3, atol=1e-4)


def test_exported_and_torchscript_files_load_onto_cuda(tmp_path: Path) -> None:
    reference = build_reference("powerful", SMALL)
    dense, sparse = example_inputs(SMALL, 33, seed=5)
    with torch.inference_mode():
        expected = reference(dense, sparse).numpy()
    for path in (export_model(reference, SMALL, tmp_path / "model.pt2"),
                 trace_model(reference, SMALL, tmp_path / "model.ts")):
        loaded = load_model(ModelSpec(name="powerful", path=str(path), config=SMALL,
                                      device="cuda"))
        assert loaded.device.type == "cuda", path
        np.testing.assert_allclose(loaded.score(dense.numpy(), sparse.numpy()), expected,
                                   rtol=1e-3, atol=1e-4, err_msg=str(path))


def test_batching_pays_on_cuda() -> None:
    from bench.batching import run

    result = run(candidates=16, seconds=1.0, device="cuda", max_clients=128)
    print(result)
    assert result["device"].startswith("cuda")
    assert result["ratio"] > 1.0, result


def test_direct_notice_stops_optional_work_on_a_cuda_worker() -> None:
    from bench.preemption import run

    result = run(notices=50, gap_ms=10.0, load_rps=200.0, device="cuda", kafka=False)
    print(result)
    assert result["device"].startswith("cuda")
    assert result["load_requests"] > 0
    shed = result["direct_notice_to_shed_ms"]
    assert 0 < shed["p50"] <= shed["p99"] <= shed["max"]
