"""A user's own model with its own inputs, served by the real worker over HTTP: per-request
dense features, per-candidate dense features and a multi-hot feature (an EmbeddingBag over
values and offsets), declared in the worker config's ``[[model.inputs]]``. The scores that come
back, through the ranking client in either encoding, are the model's own when called directly;
a request that does not fit the spec is a 422 naming the field, and a model file whose inputs
are not the spec's is refused at start naming the input."""

from __future__ import annotations

import asyncio
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import Tensor, nn

from tests.integration.worker_support import running_worker
from workers.api import RANK_PATH, Candidate, RankRequest
from workers.client.client import RankingClient
from workers.client.config import ClientConfig
from workers.features import Jagged
from workers.runtime.config import load_config
from workers.runtime.models import ModelLoadError
from workers.runtime.worker import Worker
from workers.wire import JSON_TYPE, MSGPACK_TYPE, Encoding, encode_rank_request

USER, ITEM, ROWS = 4, 3, 50
INPUTS = [{"name": "user", "kind": "request_dense", "size": USER},
          {"name": "item", "kind": "candidate_dense", "size": ITEM},
          {"name": "history", "kind": "multi_hot", "cardinality": ROWS}]


class TwoTower(nn.Module):
    """forward(user[B, 4], item[B, 3], history_values[nnz], history_offsets[B + 1])."""

    def __init__(self, user: int = USER, item: int = ITEM) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(ROWS, 8, mode="mean", include_last_offset=True)
        self.user = nn.Linear(user, 8)
        self.item = nn.Linear(item, 8)

    def forward(self, user: Tensor, item: Tensor, history_values: Tensor,
                history_offsets: Tensor) -> Tensor:
        taste = self.user(user) + self.bag(history_values, history_offsets)
        return torch.sigmoid((taste * self.item(item)).sum(dim=1))


def _example(model: TwoTower, rows: int = 5) -> tuple[Tensor, ...]:
    gen = torch.Generator().manual_seed(rows)
    lengths = torch.tensor([2, 0, 3, 1, 4][:rows] + [2] * max(0, rows - 5))
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    values = torch.randint(0, ROWS, (int(offsets[-1]),), generator=gen)
    return (torch.randn(rows, model.user.in_features, generator=gen),
            torch.randn(rows, model.item.in_features, generator=gen), values, offsets)


def save(model: TwoTower, path: Path) -> Path:
    """As torch.export (.pt2, dynamic batch and value count), ONNX (.onnx, the same dynamic
    shapes, for onnxruntime) or traced TorchScript (.ts)."""
    model.eval()
    batch, nnz = torch.export.Dim("batch", min=1), torch.export.Dim("nnz", min=0)
    dynamic = {"user": {0: batch}, "item": {0: batch}, "history_values": {0: nnz},
               "history_offsets": {0: batch + 1}}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if path.suffix == ".pt2":
            program = torch.export.export(model, _example(model), dynamic_shapes=dynamic)
            torch.export.save(program, str(path))
        elif path.suffix == ".onnx":
            onnx = torch.onnx.export(model, _example(model), dynamo=True, verbose=False,
                                     dynamic_shapes=dynamic)
            assert onnx is not None
            onnx.save(str(path), external_data=False)
        else:
            torch.jit.save(torch.jit.trace(model, _example(model)), str(path))
    return path


def config(path: Path, inputs: list[dict[str, Any]] = INPUTS) -> Any:
    return load_config(None, {"worker_id": "w1", "model.path": str(path),
                              "model.inputs": inputs, "model.device": "cpu",
                              "model.threads": 1, "model.warmup_rows": 8,
                              "batching.max_wait_ms": 1.0})


def request(n: int, seed: int) -> tuple[RankRequest, dict[str, Any]]:
    rng = np.random.default_rng(seed)
    req = RankRequest(request_id=f"r{seed}", segment="s1", value=1.0, deadline_ms=5_000.0,
                      base_count=n, candidates=[Candidate(id=i) for i in range(n)])
    history = Jagged.from_lists([rng.integers(0, ROWS, int(k)).tolist()
                                 for k in rng.integers(0, 5, n)])
    return req, {"user": rng.standard_normal(USER).astype(np.float32),
                 "item": rng.standard_normal((n, ITEM)).astype(np.float32),
                 "history": history}


def direct(model: nn.Module, features: dict[str, Any]) -> np.ndarray:
    """The model called as a user would, on the same features."""
    history, n = features["history"], len(features["item"])
    with torch.inference_mode():
        return model(torch.from_numpy(np.tile(features["user"], (n, 1))),
                     torch.from_numpy(features["item"]),
                     torch.from_numpy(history.values.astype(np.int64)),
                     torch.from_numpy(history.offsets)).numpy()


@pytest.mark.parametrize("suffix", [".pt2", ".onnx", ".ts"])
async def test_own_model_with_candidate_dense_and_multi_hot_scores_as_called_directly(
        tmp_path: Path, suffix: str) -> None:
    model = TwoTower()
    path = save(model, tmp_path / f"ranker{suffix}")
    async with running_worker(config(path)) as (_, client):
        url = str(client.make_url("")).rstrip("/")
        for encoding in ("msgpack", "json"):
            req, features = request(7, seed=len(encoding))
            settings = ClientConfig(scope="eu1", baseline_urls=[url], encoding=encoding,
                                    holdout_fraction=0.0)
            async with RankingClient(settings) as ranking:
                result = await ranking.rank(segment="s1", value=1.0, candidates=req.candidates,
                                            base_count=7, features=features)
            np.testing.assert_allclose(result.response.scores, direct(model, features),
                                       rtol=1e-5, atol=1e-6)
        health = await (await client.get("/healthz")).json()
        assert [i["name"] for i in health["inputs"]] == ["user", "item", "history"]


async def test_rows_of_concurrent_requests_batched_together_keep_their_own_features(
        tmp_path: Path) -> None:
    model = TwoTower()
    async with running_worker(config(save(model, tmp_path / "ranker.pt2"))) as (_, client):
        sent = [request(n, seed=n) for n in (1, 4, 6, 3)]
        answers = await asyncio.gather(*(
            client.post(RANK_PATH, data=encode_rank_request(req, "msgpack", features),
                        headers={"content-type": MSGPACK_TYPE}) for req, features in sent))
        for (_, features), resp in zip(sent, answers, strict=True):
            assert resp.status == 200
            scores = json.loads(await resp.read())["scores"]
            np.testing.assert_allclose(scores, direct(model, features), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("change", "named"), [
    (lambda f: f.update(user=f["user"][:3]),
     "`$.features.user`: expected 4 float32 values, got 3"),
    (lambda f: f.update(item=f["item"][:, :2]),
     "`$.features.item`: expected 5 rows (one per candidate) of 3 float32 values, got shape "
     "[5, 2]"),
    (lambda f: f.update(history=Jagged(np.array([1, 55, 2]), np.array([0, 1, 2, 3, 3, 3]))),
     "`$.features.history.values[1]` is 55; expected 0 to 49 (`cardinality` 50)"),
    (lambda f: f.update(history=Jagged(np.array([1, 2]), np.array([0, 2, 1, 2, 2, 2]))),
     "`$.features.history.offsets[2]` is 1, below `$.features.history.offsets[1]` (2)"),
    (lambda f: f.pop("history"), "`$.features.history` is missing"),
    (lambda f: f.update(extra=np.zeros(2, np.float32)),
     "`$.features.extra`: the baseline model takes no input named 'extra'"),
], ids=["user-width", "item-width", "id-beyond-cardinality", "offsets-decrease", "missing",
        "unknown"])
@pytest.mark.parametrize("encoding", ["json", "msgpack"])
async def test_a_request_that_does_not_fit_the_spec_is_a_422_naming_the_field(
        tmp_path: Path, change: Any, named: str, encoding: Encoding) -> None:
    async with running_worker(config(save(TwoTower(), tmp_path / "m.pt2"))) as (_, client):
        req, features = request(5, seed=1)
        change(features)
        resp = await client.post(RANK_PATH, data=encode_rank_request(req, encoding, features),
                                  headers={"content-type": MSGPACK_TYPE if encoding == "msgpack"
                                           else JSON_TYPE})
        error = json.loads(await resp.read())["error"]
        assert resp.status == 422 and named in error, error


@pytest.mark.parametrize("suffix", [".pt2", ".onnx"])
async def test_a_model_whose_inputs_are_not_the_spec_is_refused_at_start_naming_the_input(
        tmp_path: Path, suffix: str) -> None:
    path = save(TwoTower(item=ITEM + 2), tmp_path / f"wide{suffix}")
    with pytest.raises(ModelLoadError, match=r"input 1 \(item\) against `model\.inputs\[1\]` "
                                             r"\(item\): the model takes \[B, 5\]; the worker "
                                             r"sends item\[B, 3\] float32"):
        await Worker(config(path)).start()


async def test_a_spec_with_an_input_the_model_lacks_is_refused_at_start_naming_both(
        tmp_path: Path) -> None:
    path = save(TwoTower(), tmp_path / "m.ts")
    inputs = [*INPUTS, {"name": "region", "kind": "sparse", "size": 1}]
    with pytest.raises(ModelLoadError, match=r"takes 4 inputs \(user, item, history_values, "
                                             r"history_offsets\); its spec declares 5"):
        await Worker(config(path, inputs)).start()
