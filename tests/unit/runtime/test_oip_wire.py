"""The Open Inference Protocol as the worker speaks it: the request it sends, the scores it
reads back, and the metadata it refuses at start, each error naming the field (no server)."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from workers.runtime.oip_wire import (
    MetadataTensor,
    ModelMetadata,
    OipError,
    check_metadata,
    decode_metadata,
    decode_scores,
    encode_infer,
    expected_inputs,
)

SENT = expected_inputs("dense", 13, "sparse", 8)


def response(outputs: list[dict]) -> bytes:
    return json.dumps({"model_name": "ranker", "outputs": outputs}).encode()


def metadata(inputs: list[dict], outputs: list[dict] | None = None) -> ModelMetadata:
    return msgspec.convert({"name": "ranker", "inputs": inputs, "outputs": outputs or []},
                           ModelMetadata)


GOOD_INPUTS = [{"name": "dense", "datatype": "FP32", "shape": [-1, 13]},
               {"name": "sparse", "datatype": "INT64", "shape": [-1, 8]}]


def test_a_batch_goes_as_two_named_tensors_with_shapes_datatypes_and_row_major_data() -> None:
    dense = np.array([[0.5, 1.5], [2.5, 3.5]], dtype=np.float32)
    sparse = np.array([[1, 2, 3], [4, 5, (1 << 40) + 1]], dtype=np.int64)
    body = json.loads(encode_infer([("dense", dense), ("sparse", sparse)], "predict"))
    assert body == {
        "inputs": [{"name": "dense", "shape": [2, 2], "datatype": "FP32",
                    "data": [0.5, 1.5, 2.5, 3.5]},
                   {"name": "sparse", "shape": [2, 3], "datatype": "INT64",
                    "data": [1, 2, 3, 4, 5, (1 << 40) + 1]}],  # ids exact beyond 2**32
        "outputs": [{"name": "predict"}]}
    assert "outputs" not in json.loads(encode_infer([("dense", dense)], None))


def test_an_array_of_a_dtype_the_protocol_mapping_lacks_is_refused_naming_the_input() -> None:
    with pytest.raises(OipError, match="input `dense`: dtype float16"):
        encode_infer([("dense", np.zeros((1, 2), dtype=np.float16))], None)


@pytest.mark.parametrize("shape", [[3], [3, 1]])
def test_scores_come_back_from_a_vector_or_a_column(shape: list[int]) -> None:
    body = response([{"name": "predict", "datatype": "FP64", "shape": shape,
                      "data": [0.25, 0.5, 0.75]}])
    scores = decode_scores(body, None, 3)
    assert scores.dtype == np.float32 and scores.tolist() == [0.25, 0.5, 0.75]


def test_the_named_output_is_picked_among_several() -> None:
    body = response([{"name": "embedding", "datatype": "FP32", "shape": [2, 1], "data": [9, 9]},
                     {"name": "score", "datatype": "FP32", "shape": [2], "data": [0.1, 0.2]}])
    assert decode_scores(body, "score", 2).tolist() == pytest.approx([0.1, 0.2])
    with pytest.raises(OipError, match=r"`\$.outputs`: 2 outputs \(embedding, score\)"):
        decode_scores(body, None, 2)
    with pytest.raises(OipError, match="no output named 'predict'"):
        decode_scores(body, "predict", 2)


@pytest.mark.parametrize(("output", "named"), [
    ({"name": "p", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3, 4]},
     r"`\$.outputs\[0\]`.shape: \[2, 2\]"),
    ({"name": "p", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]},
     r"`\$.outputs\[0\]`.shape: \[4\]; expected \[3\]"),
    ({"name": "p", "datatype": "FP32", "shape": [3], "data": [1, 2]}, r"`\$.outputs\[0\]`.data"),
    ({"name": "p", "datatype": "BYTES", "shape": [3], "data": ["a", "b", "c"]}, "datatype"),
    ({"name": "p", "datatype": "FP32", "shape": [3], "data": [1, "x", 3]}, "not all numbers"),
    ({"name": "p", "datatype": "FP32", "shape": [3], "data": [1, None, 3]}, "not finite"),
])
def test_an_answer_that_is_not_one_score_per_row_is_refused_naming_the_field(
        output: dict, named: str) -> None:
    with pytest.raises(OipError, match=named):
        decode_scores(response([output]), None, 3)


def test_a_body_that_is_not_an_inference_response_is_refused() -> None:
    with pytest.raises(OipError, match="inference response"):
        decode_scores(b'{"error": "model not found"}', None, 1)
    with pytest.raises(OipError, match="inference response"):
        decode_scores(b"<html>", None, 1)


def test_metadata_with_the_inputs_the_worker_sends_passes_whatever_else_it_says() -> None:
    body = json.dumps({"name": "ranker", "versions": ["1"], "platform": "onnxruntime_onnx",
                       "inputs": GOOD_INPUTS, "outputs": [{"name": "predict",
                                                           "datatype": "FP64", "shape": [-1]}],
                       "parameters": {"content_type": "np"}}).encode()
    check_metadata(decode_metadata(body), SENT, "predict")
    fixed_batch = [{**GOOD_INPUTS[0], "shape": [64, 13]}, GOOD_INPUTS[1]]
    check_metadata(metadata(fixed_batch), SENT, None)  # a fixed size is still a size


@pytest.mark.parametrize(("inputs", "output", "named"), [
    ([GOOD_INPUTS[0]], None, "has no input 'sparse'"),
    ([{**GOOD_INPUTS[0], "datatype": "FP16"}, GOOD_INPUTS[1]], None,
     r"`inputs\[0\]` \(dense\).datatype: FP16; the worker sends FP32"),
    ([GOOD_INPUTS[0], {**GOOD_INPUTS[1], "shape": [-1, 26]}], None,
     r"`inputs\[1\]` \(sparse\).shape: \[-1, 26\]; the worker sends \[-1, 8\]"),
    ([{**GOOD_INPUTS[0], "shape": [13]}, GOOD_INPUTS[1]], None, r"\(dense\).shape: \[13\]"),
    ([*GOOD_INPUTS, {"name": "user", "datatype": "INT64", "shape": [-1]}], None,
     "takes input 'user' that the worker does not send"),
    ([], None, "declares no inputs"),
    (GOOD_INPUTS, "score", "has no output 'score'"),
])
def test_metadata_that_does_not_match_what_the_worker_sends_is_refused_naming_the_field(
        inputs: list[dict], output: str | None, named: str) -> None:
    with pytest.raises(OipError, match=named):
        check_metadata(metadata(inputs, [{"name": "predict", "datatype": "FP64",
                                          "shape": [-1]}]), SENT, output)


def test_the_tensors_the_worker_sends_follow_the_model_config() -> None:
    assert expected_inputs("d", 4, "s", 2) == [
        MetadataTensor(name="d", datatype="FP32", shape=[-1, 4]),
        MetadataTensor(name="s", datatype="INT64", shape=[-1, 2])]
