"""Reference rankers: shapes, determinism, batch independence, export/load round trips, cost."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch

from tests.unit.runtime.tiny import TINY
from workers.runtime.models import (
    ModelConfig,
    ModelLoadError,
    ModelName,
    ModelSpec,
    build_reference,
    count_flops,
    example_inputs,
    export_model,
    load_model,
    trace_model,
    warmup_sizes,
)

NAMES: list[ModelName] = ["baseline", "powerful"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("rows", [1, 7])
def test_models_score_one_probability_per_row(name: ModelName, rows: int) -> None:
    dense, sparse = example_inputs(TINY, rows)
    with torch.inference_mode():
        out = build_reference(name, TINY)(dense, sparse)
    assert out.shape == (rows,)
    assert bool(((out > 0) & (out < 1)).all())


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_weights_and_global_rng_untouched(name: ModelName) -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = build_reference(name, TINY)
    after = torch.rand(1)
    b = build_reference(name, TINY)
    c = build_reference(name, msgspec.structs.replace(TINY, seed=8))
    assert torch.equal(before, after)
    dense, sparse = example_inputs(TINY, 5)
    with torch.inference_mode():
        assert torch.equal(a(dense, sparse), b(dense, sparse))
        assert not torch.equal(a(dense, sparse), c(dense, sparse))


@pytest.mark.parametrize("name", NAMES)
def test_a_row_scores_the_same_alone_or_in_a_batch(name: ModelName) -> None:
    """Dynamic batching is only correct if rows never influence each other."""
    model = load_model(ModelSpec(name=name, config=TINY, device="cpu"))
    dense, sparse = (t.numpy() for t in example_inputs(TINY, 9))
    together = model.score(dense, sparse)
    alone = np.concatenate([model.score(dense[i:i + 1], sparse[i:i + 1]) for i in range(9)])
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-6)


def test_sparse_ids_are_hashed_into_the_table() -> None:
    model = load_model(ModelSpec(config=TINY, device="cpu"))
    dense, sparse = (t.numpy() for t in example_inputs(TINY, 3))
    small = sparse % TINY.rows_per_table
    np.testing.assert_array_equal(model.score(dense, sparse), model.score(dense, small))
    np.testing.assert_array_equal(model.score(dense, small + TINY.rows_per_table),
                                  model.score(dense, small))


@pytest.mark.parametrize("config", [TINY, ModelConfig()], ids=["tiny", "default"])
def test_powerful_model_costs_several_times_the_baseline_flops(config: ModelConfig) -> None:
    base = count_flops(build_reference("baseline", config), config)
    powerful = count_flops(build_reference("powerful", config), config)
    assert powerful >= 3 * base, (powerful, base)


@pytest.mark.parametrize("name", NAMES)
def test_torch_export_program_round_trips_with_a_dynamic_batch(name: ModelName,
                                                              tmp_path: Path) -> None:
    reference = build_reference(name, TINY)
    path = export_model(reference, TINY, tmp_path / "model.pt2")
    loaded = load_model(ModelSpec(name=name, path=str(path), config=TINY))
    assert loaded.source == str(path) and loaded.kind == name
    for rows in (1, 3, 33):
        dense, sparse = example_inputs(TINY, rows, seed=rows)
        with torch.inference_mode():
            expected = reference(dense, sparse).numpy()
        np.testing.assert_allclose(loaded.score(dense.numpy(), sparse.numpy()), expected,
                                   rtol=1e-5, atol=1e-6)


def test_torchscript_file_round_trips(tmp_path: Path) -> None:
    reference = build_reference("powerful", TINY)
    path = trace_model(reference, TINY, tmp_path / "model.ts")
    loaded = load_model(ModelSpec(name="powerful", path=str(path), config=TINY))
    dense, sparse = example_inputs(TINY, 6, seed=3)
    with torch.inference_mode():
        expected = reference(dense, sparse).numpy()
    np.testing.assert_allclose(loaded.score(dense.numpy(), sparse.numpy()), expected,
                               rtol=1e-5, atol=1e-6)


def test_missing_model_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"nope\.pt2 does not exist"):
        load_model(ModelSpec(path=str(tmp_path / "nope.pt2"), config=TINY))


def test_model_of_the_wrong_input_shape_is_refused_at_load(tmp_path: Path) -> None:
    other = msgspec.structs.replace(TINY, num_dense=6)
    path = export_model(build_reference("baseline", other), other, tmp_path / "m.pt2")
    with pytest.raises(ModelLoadError, match=r"dense\[B, 4\]"):
        load_model(ModelSpec(path=str(path), config=TINY))


def test_garbage_model_file_is_refused_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "junk.ts"
    path.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match=r"cannot load model .*junk\.ts"):
        load_model(ModelSpec(path=str(path), config=TINY))


def test_model_spec_rejects_unknown_keys_by_name() -> None:
    with pytest.raises(msgspec.ValidationError, match="layers"):
        msgspec.convert({"config": {"layers": 3}}, ModelSpec)
    with pytest.raises(msgspec.ValidationError, match="name"):
        msgspec.convert({"name": "huge"}, ModelSpec)


class _FirstFourRows(torch.nn.Module):
    """A broken user model: scores at most four rows, whatever the batch."""

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(dense[:4, 0])


def test_warm_up_passes_cover_every_batch_size_up_to_the_limit() -> None:
    assert warmup_sizes(2) == [2]
    assert warmup_sizes(64) == [2, 4, 8, 16, 32, 64]
    assert warmup_sizes(100) == [2, 4, 8, 16, 32, 64, 100]


def test_model_that_fails_on_larger_batches_is_refused_at_load_not_under_traffic(
        tmp_path: Path) -> None:
    path = tmp_path / "four.ts"
    torch.jit.save(torch.jit.script(_FirstFourRows()), str(path))
    load_model(ModelSpec(path=str(path), config=TINY, warmup_rows=4))  # small batches: fine
    with pytest.raises(ModelLoadError, match=r"shape \(4,\) for 8 rows"):
        load_model(ModelSpec(path=str(path), config=TINY, warmup_rows=8))


def test_a_loaded_model_carries_its_timed_warm_passes() -> None:
    model = load_model(ModelSpec(name="baseline", config=TINY, device="cpu", warmup_rows=64))
    assert [rows for rows, _ in model.calibration] == [16, 32, 64]
    assert all(ms >= 0.0 for _, ms in model.calibration)
