"""An ONNX model (the reference baseline, exported by `export_onnx`) served by the worker over
real HTTP through onnxruntime: as a `surplus worker` process and in process, its scores are
the torch reference's on the same rows, rows of concurrent requests batched together keep their
own scores, and a graph that is not the spec's stops the process at start naming the input."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import urllib.request
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch

from tests.integration.test_worker_cli import TINY_TOML, surplus
from tests.integration.worker_support import (
    JSON_BODY,
    TINY,
    rank_request,
    running_worker,
    tiny_config,
)
from workers.api import RANK_PATH, RankRequest, encode
from workers.runtime.models import ModelConfig, build_reference, export_onnx

#: The model TINY_TOML declares (its own MLPs; the cross and deep layers are the powerful one's).
CLI_TINY = ModelConfig(num_dense=4, num_sparse=3, rows_per_table=64, embedding_dim=4,
                       bottom_mlp=(8,), top_mlp=(8,))


def reference_scores(cfg: ModelConfig, req: RankRequest) -> np.ndarray:
    """The torch baseline's scores of a request's candidates, called directly."""
    n = len(req.candidates)
    dense = torch.tensor([req.dense] * n, dtype=torch.float32)
    sparse = torch.tensor([c.sparse for c in req.candidates], dtype=torch.int64)
    with torch.inference_mode():
        return build_reference("baseline", cfg)(dense, sparse).numpy()


def test_surplus_worker_serves_an_onnx_file_with_the_torch_models_scores(
        tmp_path: Path) -> None:
    path = export_onnx(build_reference("baseline", CLI_TINY), CLI_TINY, tmp_path / "rank.onnx")
    config = tmp_path / "worker.toml"
    config.write_text(TINY_TOML)
    proc = surplus("worker", "--config", str(config), "--port", "0", "--no-kafka",
                   "--model-path", str(path), "--loglevel", "warning")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"ready on (http://[\d.]+:\d+)", line)
        assert match, line + (proc.stderr.read() if proc.stderr else "")
        base = match.group(1)
        with urllib.request.urlopen(f"{base}/readyz", timeout=10) as resp:
            assert json.load(resp)["model"] == str(path)
        req = rank_request(6, 0, seed=3)
        http = urllib.request.Request(f"{base}{RANK_PATH}", data=encode(req), headers=JSON_BODY)
        with urllib.request.urlopen(http, timeout=10) as resp:
            answer = json.load(resp)
        assert answer["scored"] == 6
        np.testing.assert_allclose(answer["scores"], reference_scores(CLI_TINY, req),
                                   rtol=1e-5, atol=1e-6)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


async def test_concurrent_requests_of_1_17_and_512_rows_keep_their_own_scores(
        tmp_path: Path) -> None:
    path = export_onnx(build_reference("baseline", TINY), TINY, tmp_path / "rank.onnx")
    config = tiny_config(**{"model.path": str(path), "batching.max_batch_rows": 1024})
    async with running_worker(config) as (worker, client):
        assert worker.model is not None and worker.model.source == str(path)
        sent = [rank_request(n, 0, request_id=f"r{n}", seed=n) for n in (1, 17, 512)]
        answers = await asyncio.gather(*(client.post(RANK_PATH, data=encode(req),
                                                     headers=JSON_BODY) for req in sent))
        for req, resp in zip(sent, answers, strict=True):
            assert resp.status == 200
            scores = json.loads(await resp.read())["scores"]
            np.testing.assert_allclose(scores, reference_scores(TINY, req), rtol=1e-5,
                                       atol=1e-6)


@pytest.mark.slow
def test_an_onnx_graph_that_is_not_the_spec_stops_the_worker_naming_the_input(
        tmp_path: Path) -> None:
    wide = msgspec.structs.replace(CLI_TINY, num_dense=6)
    path = export_onnx(build_reference("baseline", wide), wide, tmp_path / "wide.onnx")
    config = tmp_path / "worker.toml"
    config.write_text(TINY_TOML)
    proc = surplus("worker", "--config", str(config), "--port", "0", "--no-kafka",
                   "--model-path", str(path))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert ("wide.onnx input 0 (dense) against `model.config.num_dense` (dense): the model "
            "takes [B, 6]; the worker sends dense[B, 4] float32") in err, err
