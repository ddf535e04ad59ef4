"""ONNX files served through onnxruntime: the exported reference models score as torch does,
and a graph that does not take the spec's tensors, or returns other than a score per row, is
refused at load naming the input or output. The graphs of the refusals are built with onnx's
own helpers, so each differs from a good one in exactly one thing."""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from tests.unit.runtime.tiny import TINY
from workers.features import Declared, Input, Signature, SignatureMismatch
from workers.runtime.models import (
    ModelConfig,
    ModelLoadError,
    ModelName,
    ModelSpec,
    build_reference,
    example_inputs,
    export_onnx,
    load_model,
)
from workers.runtime.onnx_model import check_graph, declared, execution_device

FIXED = Signature.fixed(4, 3)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each reference model at TINY and the baseline at the default sizes, as ONNX (one export
    each, a few seconds, shared by the module's tests)."""
    out = tmp_path_factory.mktemp("onnx")
    files = {name: export_onnx(build_reference(name, TINY), TINY, out / f"{name}.onnx")
             for name in ("baseline", "powerful")}
    default = ModelConfig()
    files["default"] = export_onnx(build_reference("baseline", default), default,
                                   out / "default.onnx")
    return files


@pytest.mark.parametrize("name", ["baseline", "powerful"])
def test_onnx_export_of_a_reference_model_scores_as_torch_at_1_17_and_512_rows(
        name: ModelName, exported: dict[str, Path]) -> None:
    reference = build_reference(name, TINY)
    loaded = load_model(ModelSpec(name=name, path=str(exported[name]), config=TINY,
                                  device="cpu", warmup_rows=512))
    assert loaded.source == str(exported[name]) and loaded.kind == name
    assert loaded.device.type == "cpu" and [r for r, _ in loaded.calibration][-1] == 512
    for rows in (1, 17, 512):
        dense, sparse = example_inputs(TINY, rows, seed=rows)
        with torch.inference_mode():
            expected = reference(dense, sparse).numpy()
        scores = loaded.score(dense.numpy(), sparse.numpy())
        assert scores.dtype == np.float32 and scores.shape == (rows,)
        np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)


def test_onnx_model_at_the_default_sizes_scores_as_torch(exported: dict[str, Path]) -> None:
    default = ModelConfig()
    loaded = load_model(ModelSpec(path=str(exported["default"]), device="cpu"))
    dense, sparse = example_inputs(default, 512, seed=5)
    with torch.inference_mode():
        expected = build_reference("baseline", default)(dense, sparse).numpy()
    np.testing.assert_allclose(loaded.score(dense.numpy(), sparse.numpy()), expected,
                               rtol=1e-5, atol=1e-6)


def test_onnx_model_of_the_wrong_width_is_refused_naming_the_input(tmp_path: Path) -> None:
    wide = msgspec.structs.replace(TINY, num_dense=6)
    path = export_onnx(build_reference("baseline", wide), wide, tmp_path / "wide.onnx")
    with pytest.raises(ModelLoadError, match=r"wide\.onnx input 0 \(dense\) against "
                                             r"`model\.config\.num_dense` \(dense\): the model "
                                             r"takes \[B, 6\]; the worker sends dense\[B, 4\]"):
        load_model(ModelSpec(path=str(path), config=TINY))


def _graph(path: Path, *, dense: tuple[int | str, int] = ("batch", 4),
           dense_type: int = TensorProto.FLOAT, sparse: bool = True,
           outputs: tuple[str, ...] = ("score",), out_type: int = TensorProto.FLOAT,
           out_shape: tuple[int | str, ...] = ("batch",)) -> Path:
    """A model that scores sigmoid(sum of dense) per row, ``sparse`` an unused second input;
    each keyword changes one thing about the graph."""
    nodes = [helper.make_node("Cast", ["dense"], ["dense_f"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["dense_f", "axis"], ["total"], keepdims=0),
             helper.make_node("Sigmoid", ["total"], ["prob"])]
    for name in outputs:
        nodes.append(helper.make_node("Cast", ["prob"], [f"{name}_cast"], to=out_type))
        nodes.append(helper.make_node("Reshape", [f"{name}_cast", "out_shape"], [name]))
    inputs = [helper.make_tensor_value_info("dense", dense_type, list(dense))]
    if sparse:
        inputs.append(helper.make_tensor_value_info("sparse", TensorProto.INT64, ["batch", 3]))
    reshape = [-1 if isinstance(d, str) else d for d in out_shape]
    graph = helper.make_graph(
        nodes, "ranker", inputs,
        [helper.make_tensor_value_info(name, out_type, list(out_shape)) for name in outputs],
        initializer=[helper.make_tensor("axis", TensorProto.INT64, [1], [1]),
                     helper.make_tensor("out_shape", TensorProto.INT64, [len(reshape)],
                                        reshape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_a_hand_built_graph_of_the_spec_serves(tmp_path: Path) -> None:
    loaded = load_model(ModelSpec(path=str(_graph(tmp_path / "ok.onnx")), config=TINY))
    dense, sparse = (t.numpy() for t in example_inputs(TINY, 9))
    np.testing.assert_allclose(loaded.score(dense, sparse),
                               1 / (1 + np.exp(-dense.sum(axis=1))), rtol=1e-6)


@pytest.mark.parametrize(("change", "named"), [
    ({"dense_type": TensorProto.DOUBLE},
     r"input 0 \(dense\) against `model\.config\.num_dense` \(dense\): the model takes "
     r"float64; the worker sends dense\[B, 4\] float32"),
    ({"sparse": False},
     r"takes 1 inputs \(dense\); its spec declares 2 \(dense, sparse\)"),
    ({"dense": (8, 4)},
     r"input 0 \(dense\) .*: the model takes \[8, 4\], a fixed 8 in the first dimension; "
     r"the worker sends dense\[B, 4\] float32, any number there"),
    ({"outputs": ("score", "logit")},
     r"has 2 outputs \(score, logit\); a ranking model returns one"),
    ({"out_type": TensorProto.INT64},
     r"output 0 \(score\): the model returns int64; the worker reads a float score per row"),
    ({"out_shape": ("batch", 3)},
     r"output 0 \(score\): the model returns \[B, 3\]; the worker reads one score per row"),
    ({"out_shape": (4,)},
     r"output 0 \(score\): the model returns \[4\], a fixed 4 scores"),
], ids=["input-dtype", "input-count", "fixed-batch", "two-outputs", "int-output",
        "wide-output", "fixed-output"])
def test_a_graph_that_does_not_fit_the_spec_is_refused_at_load_naming_it(
        tmp_path: Path, change: dict, named: str) -> None:
    path = _graph(tmp_path / "bad.onnx", **change)
    with pytest.raises(ModelLoadError, match=named):
        load_model(ModelSpec(path=str(path), config=TINY))


def test_a_graph_of_declared_inputs_is_checked_against_them(tmp_path: Path) -> None:
    """``[[model.inputs]]`` apply to ONNX files as to torch files: inputs fed in the spec's
    order, whatever the graph names them."""
    path = _graph(tmp_path / "named.onnx")
    inputs = (Input(name="user", kind="candidate_dense", size=4),
              Input(name="tags", kind="sparse", size=3, cardinality=10))
    loaded = load_model(ModelSpec(path=str(path), config=TINY, inputs=inputs))
    user = np.ones((2, 4), np.float64)  # cast to the spec's float32 on the way in
    np.testing.assert_allclose(loaded.score(user, np.zeros((2, 3), np.int64)),
                               [1 / (1 + np.exp(-4.0))] * 2, rtol=1e-6)
    with pytest.raises(ModelLoadError, match=r"input 1 \(sparse\) against `model\.inputs\[1\]` "
                                             r"\(tags\): the model takes \[B, 3\]; the worker "
                                             r"sends tags\[B, 2\] int64"):
        load_model(ModelSpec(path=str(path), config=TINY, inputs=(
            inputs[0], Input(name="tags", kind="sparse", size=2))))


def test_a_file_that_is_not_onnx_is_refused_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"not a graph")
    with pytest.raises(ModelLoadError, match=r"cannot load model .*junk\.onnx"):
        load_model(ModelSpec(path=str(path), config=TINY))
    with pytest.raises(ModelLoadError, match=r"nope\.onnx does not exist"):
        load_model(ModelSpec(path=str(tmp_path / "nope.onnx"), config=TINY))


# -- the pure parts ------------------------------------------------------------------------------


def test_symbolic_and_unknown_dimensions_are_the_ones_that_vary() -> None:
    assert declared("dense", "tensor(float)", ["batch", 13]) == Declared(
        "dense", "float32", (None, 13))
    assert declared("v", "tensor(int64)", [None]) == Declared("v", "int64", (None,))
    assert declared("x", "tensor(double)", None) == Declared("x", "float64", None)


def test_an_output_of_b_by_1_scores_and_an_unknown_shape_is_left_to_the_warm_up() -> None:
    inputs = [Declared("dense", "float32", (None, 4)), Declared("sparse", "int64", (None, 3))]
    for shape in [(None, 1), (None, None), (None,), None]:
        check_graph(inputs, [Declared("p", "float32", shape)], FIXED, "m.onnx")
    with pytest.raises(SignatureMismatch, match="has 0 outputs"):
        check_graph(inputs, [], FIXED, "m.onnx")


@pytest.mark.parametrize(("choice", "gpu", "providers", "device"), [
    ("auto", False, ["CPUExecutionProvider"], "cpu"),
    ("auto", True, ["CPUExecutionProvider"], "cpu"),    # PyPI's onnxruntime on a GPU node
    ("auto", True, ["CUDAExecutionProvider", "CPUExecutionProvider"], "cuda"),
    ("auto", False, ["CUDAExecutionProvider", "CPUExecutionProvider"], "cpu"),
    ("cpu", True, ["CUDAExecutionProvider", "CPUExecutionProvider"], "cpu"),
    ("cuda", True, ["CUDAExecutionProvider", "CPUExecutionProvider"], "cuda"),
])
def test_an_onnx_model_runs_on_cuda_only_where_onnxruntime_has_the_provider(
        choice: str, gpu: bool, providers: list[str], device: str) -> None:
    assert execution_device(choice, gpu, providers) == device


def test_cuda_asked_of_an_onnxruntime_without_it_says_what_to_install() -> None:
    with pytest.raises(ValueError, match=r"`model\.device` is cuda, and this onnxruntime has no "
                                         r"CUDAExecutionProvider .*install onnxruntime-gpu"):
        execution_device("cuda", True, ["CPUExecutionProvider"])
