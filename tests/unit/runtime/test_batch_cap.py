"""The batch cap by device: a worker whose model runs on CUDA takes thousands of rows a pass,
one on the CPU (or behind a model server) keeps 512, and a configured cap wins on either."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from tests.unit.runtime.test_batching import RecordingScorer, hold_first_pass, rows
from workers.policy.admission import Admission, AdmissionConfig
from workers.runtime.batching import DEFAULT_BATCH_ROWS, Batcher, BatchingConfig, Job, batch_rows
from workers.runtime.config import WorkerConfig, load_config
from workers.runtime.worker import Worker


def config(**overrides: object) -> WorkerConfig:
    """A worker of the reference baseline on one CPU thread; ``overrides`` are dotted keys."""
    return load_config(None, {"worker_id": "w1", "model.device": "cpu", "model.threads": 1,
                              "model.warmup_rows": 16, **overrides})


@pytest.mark.parametrize(("configured", "device", "cap"), [
    (None, "cpu", 512),
    (None, "cuda", 8192),
    (None, "mps", 512),       # a device without a default of its own: the CPU's
    (100, "cpu", 100),
    (100, "cuda", 100),
    (20_000, "cuda", 20_000),
])
def test_the_cap_is_the_configured_one_or_the_devices(configured: int | None, device: str,
                                                      cap: int) -> None:
    assert batch_rows(BatchingConfig(max_batch_rows=configured), device) == cap


def test_a_config_without_a_cap_leaves_it_to_the_device() -> None:
    assert BatchingConfig().max_batch_rows is None
    assert config().batching.max_batch_rows is None
    assert DEFAULT_BATCH_ROWS == {"cpu": 512, "cuda": 8192}


@pytest.mark.parametrize(("device", "passes"), [("cpu", [1, 500, 500, 500]),
                                                ("cuda", [1, 1500])])
async def test_a_batcher_sized_for_cuda_takes_what_the_cpu_splits(device: str,
                                                                  passes: list[int]) -> None:
    gate = threading.Event()
    scorer = RecordingScorer(gate)
    admission: Admission[Job] = Admission(AdmissionConfig(max_queue_delay_ms=60_000.0))
    batcher = Batcher(scorer, admission, BatchingConfig(max_wait_ms=0.0))
    assert batcher.size_for(device) == admission.batch_units == batch_rows(BatchingConfig(),
                                                                          device)
    batcher.start()
    try:
        first = await hold_first_pass(batcher, scorer)
        futures = [batcher.submit_baseline(rows(tag, 500)) for tag in range(3)]
        gate.set()
        await asyncio.wait_for(asyncio.gather(first, *futures), 10)
        assert [len(b) for b in scorer.batches] == passes
    finally:
        gate.set()
        batcher.stop(5)


@dataclass
class OnDevice:
    """A model in process on ``device``, scoring zeros."""

    device: torch.device
    source: str = "fake"

    def score(self, *inputs: np.ndarray) -> np.ndarray:
        return np.zeros(len(inputs[1]), np.float32)


@dataclass
class Remote:
    """A model server's stand-in: no device of its own in this process."""

    source: str = "oip"

    def score(self, *inputs: np.ndarray) -> np.ndarray:
        return np.zeros(len(inputs[1]), np.float32)


@pytest.mark.parametrize(("model", "overrides", "cap"), [
    (OnDevice(torch.device("cuda")), {}, 8192),
    (OnDevice(torch.device("cpu")), {}, 512),
    (Remote(), {}, 512),
    (OnDevice(torch.device("cuda")), {"batching.max_batch_rows": 1000}, 1000),
], ids=["cuda", "cpu", "model-server", "configured"])
async def test_a_worker_caps_its_passes_for_the_device_its_model_runs_on(
        model: OnDevice | Remote, overrides: dict[str, int], cap: int) -> None:
    worker = Worker(config(**overrides))
    await worker.start(model=model)
    try:
        assert worker.batcher.max_batch_rows == worker.admission.batch_units == cap
    finally:
        await worker.stop(5)


async def test_a_worker_serving_the_reference_model_on_the_cpu_keeps_512() -> None:
    worker = Worker(config())
    await worker.start()
    try:
        assert worker.batcher.max_batch_rows == 512
    finally:
        await worker.stop(5)
