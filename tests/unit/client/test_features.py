"""The model spec (`workers.features`) and how requests carry it (`workers.wire`): declared
inputs validated by key, features read the same from JSON and msgpack, every misfit refused
naming the field, rows cut and batched without mixing requests, and a model's declared inputs
compared with the spec by name. Pure: no torch, no HTTP."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import numpy as np
import pytest

from schemas.codec import ContractError
from workers.api import Candidate, RankRequest
from workers.features import (
    Declared,
    FeatureError,
    Input,
    Jagged,
    Rows,
    Signature,
    SignatureMismatch,
    SpecError,
    assemble,
    check_model_args,
    example_rows,
)
from workers.wire import (
    check_feature_rows,
    decode_rank_request,
    encode_rank_request,
    model_inputs,
    model_rows,
    take_features,
)

SPEC = Signature.of([Input(name="user", kind="request_dense", size=3),
                     Input(name="item", kind="candidate_dense", size=2, dtype="float64"),
                     Input(name="cats", kind="sparse", size=2, cardinality=100),
                     Input(name="history", kind="multi_hot", cardinality=1000)])


def _request(n: int = 4) -> RankRequest:
    return RankRequest(request_id="r1", segment="s", value=1.0, deadline_ms=100.0,
                       base_count=min(n, 2), candidates=[Candidate(id=i) for i in range(n)])


def _features(n: int = 4, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {"user": rng.standard_normal(3).astype(np.float32),
            "item": rng.standard_normal((n, 2)),
            "cats": rng.integers(0, 100, (n, 2)),
            "history": Jagged.from_lists([list(range(i)) for i in range(n)])}


def _rows(features: dict[str, Any], encoding: str, n: int = 4) -> Rows:
    body = encode_rank_request(_request(n), "json" if encoding == "json" else "msgpack",
                               features)
    return model_rows(decode_rank_request(body, "json" if encoding == "json" else "msgpack"),
                      SPEC, "baseline")


def test_json_and_msgpack_give_the_model_the_same_arrays_in_its_dtypes() -> None:
    features = _features()
    from_json, from_msgpack = _rows(features, "json"), _rows(features, "msgpack")
    args_json, args_msgpack = assemble([from_json]), assemble([from_msgpack])
    for a, b, arg in zip(args_json, args_msgpack, SPEC.args(), strict=True):
        assert a.dtype == b.dtype == arg.dtype, arg.name
        np.testing.assert_array_equal(a, b)
    user, item, cats, values, offsets = args_msgpack
    np.testing.assert_array_equal(user, np.tile(features["user"], (4, 1)))
    np.testing.assert_array_equal(item, features["item"])
    np.testing.assert_array_equal(cats, features["cats"])
    assert values.tolist() == [0, 0, 1, 0, 1, 2] and offsets.tolist() == [0, 0, 1, 3, 6]


def test_a_msgpack_request_round_trips_its_features_into_the_json_shape() -> None:
    features = _features()
    columns = decode_rank_request(encode_rank_request(_request(), "msgpack", features),
                                  "msgpack")
    as_json = columns.to_request() if not isinstance(columns, RankRequest) else columns
    np.testing.assert_array_equal(assemble([model_rows(as_json, SPEC, "m")])[4],
                                  [0, 0, 1, 3, 6])


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
@pytest.mark.parametrize(("change", "named"), [
    ({"user": np.zeros(2, np.float32)}, "`$.features.user`: expected 3 float32 values, got 2"),
    ({"user": np.array([0.0, np.nan, 1.0])}, "`$.features.user[1]`"),  # JSON: null
    ({"item": np.zeros((3, 2))}, "`$.features.item`: expected 4 rows (one per candidate) of 2 "
                                 "float64 values, got shape [3, 2]"),
    ({"cats": np.array([[1, 2], [3, 100], [0, 0], [0, 0]])},
     "`$.features.cats[1][1]` is 100; expected 0 to 99 (`cardinality` 100)"),
    ({"cats": np.zeros((4, 2), np.float32)}, "`$.features.cats"),
    ({"history": Jagged(np.array([1, 2]), np.array([0, 1, 2]))},
     "`$.features.history.offsets`: expected 5 offsets"),
    ({"history": Jagged(np.array([1, 2]), np.array([1, 1, 2, 2, 2]))},
     "`$.features.history.offsets`: must start at 0 and end at 2"),
    ({"history": Jagged(np.array([1, -2]), np.array([0, 1, 2, 2, 2]))},
     "`$.features.history.values[1]` is -2"),
    ({"other": np.zeros(3)}, "`$.features.other`: the baseline model takes no input named "
                             "'other' (it takes user, item, cats, history)"),
], ids=["width", "nan", "rows", "id-range", "float-ids", "offset-count", "offset-ends",
        "negative-id", "unknown"])
def test_a_feature_that_does_not_fit_the_spec_is_refused_naming_the_field(
        encoding: str, change: dict[str, Any], named: str) -> None:
    features = {**_features(), **change}
    with pytest.raises(FeatureError, match=re.escape(named)):
        _rows(features, encoding)


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_a_missing_feature_and_a_stray_fixed_field_are_refused_by_name(encoding: str) -> None:
    features = _features()
    del features["history"]
    with pytest.raises(FeatureError, match=re.escape("`$.features.history` is missing: the "
                                                     "baseline model takes history (any number")):
        _rows(features, encoding)
    stray = msgspec.structs.replace(_request(), dense=[1.0])
    body = encode_rank_request(stray, "json" if encoding == "json" else "msgpack", _features())
    with pytest.raises(FeatureError, match=re.escape("`$.dense`: the baseline model takes no "
                                                     "input named 'dense'")):
        model_rows(decode_rank_request(body, "json" if encoding == "json" else "msgpack"),
                   SPEC, "baseline")


def test_the_fixed_signature_still_reads_dense_and_sparse_and_refuses_a_missing_column() -> None:
    request = RankRequest(request_id="r", segment="s", value=1.0, deadline_ms=9.0, base_count=1,
                          dense=[0.5, 1.5], candidates=[Candidate(id=1, sparse=[4, 5, 6])])
    dense, sparse = model_inputs(request, 2, 3, "baseline")
    assert dense.tolist() == [0.5, 1.5] and sparse.tolist() == [[4, 5, 6]]
    bare = msgspec.msgpack.encode({"request_id": "r", "segment": "s", "value": 1.0,
                                   "deadline_ms": 9.0, "base_count": 0,
                                   "ids": {"dtype": "<i8", "shape": [1],
                                           "data": np.array([1]).tobytes()},
                                   "priors": {"dtype": "<f8", "shape": [1],
                                              "data": np.array([0.0]).tobytes()}})
    with pytest.raises(FeatureError, match=re.escape("`$.dense` has 0 values; the baseline "
                                                     "model takes 2")):
        model_inputs(decode_rank_request(bare, "msgpack"), 2, 3, "baseline")


def test_the_client_cuts_per_candidate_features_with_the_candidates_it_sends() -> None:
    features = _features(n=5)
    cut = take_features(features, 2)
    np.testing.assert_array_equal(cut["user"], features["user"])
    np.testing.assert_array_equal(cut["item"], features["item"][:2])
    history = cut["history"]
    assert isinstance(history, Jagged)
    assert history.values.tolist() == [0] and history.offsets.tolist() == [0, 0, 1]
    with pytest.raises(ContractError, match=re.escape("`$.features.item` has 5 rows but 4 "
                                                      "candidates")):
        check_feature_rows(features, 4)


def test_rows_of_several_requests_batch_with_their_own_dense_vectors_and_rebased_offsets() -> None:
    a, b = example_rows(SPEC, 3, seed=1), example_rows(SPEC, 2, seed=2)
    user, _, _, values, offsets = assemble([a, b.take(1, 2)])
    assert user.shape == (4, 3) and (user[:3] == a.parts[0]).all() and (user[3] == b.parts[0]).all()
    a_history, b_history = a.parts[3], b.parts[3]
    assert isinstance(a_history, Jagged) and isinstance(b_history, Jagged)
    tail = b_history.take(1, 2)
    assert offsets.tolist() == [*a_history.offsets.tolist(),
                                len(a_history.values) + len(tail.values)]
    np.testing.assert_array_equal(values, np.concatenate([a_history.values, tail.values]))


@pytest.mark.parametrize(("inputs", "named"), [
    ([{"name": "a", "kind": "multi_hot", "size": 3}], "a multi_hot input has no `size`"),
    ([{"name": "a", "kind": "candidate_dense"}], "a candidate_dense input needs `size`"),
    ([{"name": "a", "kind": "sparse", "size": 1, "dtype": "float32"}],
     "dtype float32 does not fit a sparse input"),
    ([{"name": "a", "kind": "request_dense", "size": 1, "cardinality": 5}],
     "`cardinality` is for ids"),
    ([{"name": "1a", "kind": "sparse", "size": 1}], "`$[0].name`"),
])
def test_a_bad_input_declaration_is_refused_naming_it(inputs: list[dict[str, Any]],
                                                      named: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=re.escape(named)):
        msgspec.convert(inputs, tuple[Input, ...])


def test_two_inputs_that_would_make_one_tensor_name_are_refused_by_key() -> None:
    with pytest.raises(SpecError, match=re.escape("`model.inputs[1].name`: 'h_values'")):
        Signature.of([Input(name="h", kind="multi_hot"),
                      Input(name="h_values", kind="candidate_dense", size=1)])


def test_a_model_declaring_other_inputs_than_the_spec_is_refused_naming_the_input() -> None:
    good = [Declared("user", "float32", (None, 3)), Declared("item", "float64", (None, 2)),
            Declared("cats", "int64", (None, 2)), Declared("hv", "int64", (None,)),
            Declared("ho", "int64", (None,))]
    check_model_args(good, SPEC, "m.pt2")
    check_model_args([Declared(d.name) for d in good], SPEC, "m.ts")   # TorchScript: names only
    wide = [good[0], Declared("item", "float64", (None, 5)), *good[2:]]
    with pytest.raises(SignatureMismatch, match=re.escape(
            "m.pt2 input 1 (item) against `model.inputs[1]` (item): the model takes [B, 5]; "
            "the worker sends item[B, 2] float64")):
        check_model_args(wide, SPEC, "m.pt2")
    ints = [*good[:2], Declared("cats", "int32", (None, 2)), *good[3:]]
    with pytest.raises(SignatureMismatch, match=re.escape("input 2 (cats) against "
                                                          "`model.inputs[2]` (cats): the model "
                                                          "takes int32")):
        check_model_args(ints, SPEC, "m.pt2")
    with pytest.raises(SignatureMismatch, match=re.escape("m.ts takes 4 inputs (user, item, "
                                                          "cats, hv); its spec declares 5")):
        check_model_args([Declared(d.name) for d in good[:4]], SPEC, "m.ts")
