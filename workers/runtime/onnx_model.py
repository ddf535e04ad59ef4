"""ONNX model files (``.onnx``) scored in process by onnxruntime, under the same spec as torch's.

Many training pipelines hand over ONNX rather than a torch file, and onnxruntime scores it
without torch in the loop. The worker treats such a file as it treats a ``torch.export``
program: the graph declares its inputs' dtypes and shapes, start compares them with the spec
(`workers.features.check_model_args`) and refuses, naming the input, a graph that does not
take what the spec sends; here it also checks what a program does not declare to torch: the
one output (a float score per row) and a batch dimension that varies, since a graph exported
at a fixed batch fails on every batch the batcher makes but that one. Inputs are fed in the
spec's order, whatever the graph calls them, as a torch file's are.

The checks are pure (`declared`, `check_graph`, `execution_device`); `OnnxSession` is the thin
edge around ``onnxruntime.InferenceSession``, imported only when a file is loaded so a torch
worker never pays for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from workers.features import Declared, Signature, SignatureMismatch, check_model_args

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
#: ONNX's element types as onnxruntime names them, in numpy's words (the spec's dtypes).
_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
           "tensor(bfloat16)": "bfloat16", "tensor(int32)": "int32", "tensor(int64)": "int64",
           "tensor(int16)": "int16", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
           "tensor(bool)": "bool", "tensor(string)": "string"}
#: What the worker reads a score from (it hands on float32 whichever of these the graph returns).
_SCORE_DTYPES = ("float16", "bfloat16", "float32", "float64")


def declared(name: str, onnx_type: str, shape: Sequence[int | str | None] | None) -> Declared:
    """One graph input or output as `check_model_args` reads it: a symbolic or unknown
    dimension (``"batch"``, None) is None, one that varies."""
    dtype = _DTYPES.get(onnx_type, onnx_type)
    dims = None if shape is None else tuple(
        d if isinstance(d, int) and d >= 0 else None for d in shape)
    return Declared(name, dtype, dims)


def check_graph(inputs: Sequence[Declared], outputs: Sequence[Declared], signature: Signature,
                source: str) -> None:
    """Refuse a graph that cannot serve the spec; SignatureMismatch names the input or output.

    The inputs as a ``torch.export`` program's are checked (count, dtypes, fixed dimensions),
    then that each ``[B, ...]`` input's batch varies, then that there is one output, a float
    score per row (``[B]`` or ``[B, 1]``)."""
    check_model_args(inputs, signature, source)
    for position, (got, want) in enumerate(zip(inputs, signature.args(), strict=True)):
        if got.shape and want.shape[0] is None and got.shape[0] is not None:
            raise SignatureMismatch(
                f"{source} input {position} ({got.name}) against `{want.key}` ({want.field}): "
                f"the model takes {_dims(got.shape)}, a fixed {got.shape[0]} in the first "
                f"dimension; the worker sends {want.describe()}, any number there: export "
                "with a dynamic batch (and value count for multi-hot ids)")
    if len(outputs) != 1:
        raise SignatureMismatch(
            f"{source} has {len(outputs)} outputs ({', '.join(o.name for o in outputs)}); a "
            "ranking model returns one, a float score per row: float32[B]")
    out = outputs[0]
    where = f"{source} output 0 ({out.name})"
    if out.dtype not in _SCORE_DTYPES:
        raise SignatureMismatch(f"{where}: the model returns {out.dtype}; the worker reads "
                                "a float score per row, float32[B]")
    if out.shape is None:
        return
    if len(out.shape) not in (1, 2) or (len(out.shape) == 2 and out.shape[1] not in (1, None)):
        raise SignatureMismatch(f"{where}: the model returns {_dims(out.shape)}; the worker "
                                "reads one score per row, float32[B] (or [B, 1])")
    if out.shape[0] is not None:
        raise SignatureMismatch(f"{where}: the model returns {_dims(out.shape)}, a fixed "
                                f"{out.shape[0]} scores; the worker reads one per row of any "
                                "batch: export with a dynamic batch")


def execution_device(choice: str, gpu: bool, providers: Sequence[str]) -> str:
    """Where an ONNX model runs, ``cpu`` or ``cuda``, for the spec's ``model.device``:
    ``auto`` takes CUDA where a GPU answers and onnxruntime has its CUDA provider (PyPI's
    ``onnxruntime`` has none; ``onnxruntime-gpu`` does) and the CPU otherwise; ``cuda`` without
    the provider is an error that says so (ValueError), not a silent run on the CPU."""
    if choice == "cuda" and CUDA not in providers:
        raise ValueError("`model.device` is cuda, and this onnxruntime has no "
                         f"{CUDA} (it has {', '.join(providers) or 'none'}): install "
                         "onnxruntime-gpu in place of onnxruntime, or set `model.device`")
    if choice == "cuda" or (choice == "auto" and gpu and CUDA in providers):
        return "cuda"
    return "cpu"


def _dims(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("B" if d is None else str(d) for d in shape) + "]"


class OnnxSession:
    """An ONNX file open in onnxruntime, scoring numpy rows (a `Scorer`); called from the
    inference thread only, one batch at a time."""

    def __init__(self, path: str | Path, device: str, threads: int) -> None:
        """Opens ``path`` on ``device`` (`execution_device`) with ``threads`` intra-op threads
        and one inter-op thread, as torch is set up, so both backends take the same cores."""
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3  # errors only: its warnings go to stderr, not our logs
        providers = [CUDA, CPU] if device == "cuda" else [CPU]
        self.device = device
        self._session: Any = ort.InferenceSession(str(path), options, providers=providers)
        self.inputs = [declared(i.name, i.type, i.shape) for i in self._session.get_inputs()]
        self.outputs = [declared(o.name, o.type, o.shape) for o in self._session.get_outputs()]
        self._names = [i.name for i in self.inputs]

    @staticmethod
    def providers() -> list[str]:
        """The execution providers this onnxruntime build has."""
        import onnxruntime as ort

        return list(ort.get_available_providers())

    def score(self, *inputs: np.ndarray) -> np.ndarray:
        """Scores (float32[B]) of rows given in the spec's order and dtypes (`LoadedModel.score`
        casts them), fed to the graph's inputs in theirs."""
        feed = {name: np.ascontiguousarray(x)
                for name, x in zip(self._names, inputs, strict=True)}
        out = self._session.run([self.outputs[0].name], feed)[0]
        return np.asarray(out).reshape(-1).astype(np.float32, copy=False)
