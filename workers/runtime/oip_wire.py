"""The Open Inference Protocol (KServe v2 REST) as the worker speaks it: pure, no HTTP.

What a Surplus worker sends a model server (Triton, KServe, MLServer, TorchServe all serve
this protocol) is one inference request per batch: the batch's dense features and sparse ids
as two named tensors, ``FP32[B, num_dense]`` and ``INT64[B, num_sparse]``, row-major in the
JSON ``data`` field; what it reads back is one output tensor of ``B`` scores (shape ``[B]`` or
``[B, 1]``, any numeric datatype). At start the model's metadata (``GET /v2/models/{name}``)
must declare those inputs with those datatypes and shapes: a mismatch would otherwise show up
as a failed batch on live traffic, or worse as scores of the wrong features.

Kept apart from the HTTP client (``workers.runtime.oip``) as ddsketch keeps its wire format
apart from the sketch: the encoding, the decoding and the metadata check are tested without a
server, and every error names the field (``$.outputs[0].shape``) as the rest of Surplus does.
The binary tensor extension is not used: JSON is what every server of the protocol accepts.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import numpy as np
from msgspec import Meta

from workers.features import Arg

#: numpy dtype of a tensor the worker sends -> its OIP datatype.
DATATYPES: dict[np.dtype[Any], str] = {
    np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64", np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64"}
#: OIP datatypes a score tensor may come back in.
SCORE_DATATYPES = frozenset({"FP16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64",
                             "UINT8", "UINT16", "UINT32", "UINT64"})


class OipError(ValueError):
    """A model server's answer or metadata is not what the worker needs; names the field."""


TensorName = Annotated[str, Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:\-]+$")]
Seconds = Annotated[float, Meta(gt=0.0, le=600.0)]


class OipSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Where the model server is and how to call it: the worker config's ``[model.oip]``."""

    #: Base URL of the server's REST endpoint (``/v2/...`` is appended), e.g.
    #: ``http://triton:8000``; a path prefix (a KServe ingress) is kept.
    url: Annotated[str, Meta(pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$", max_length=500)]
    #: The model's name on the server (``/v2/models/{model_name}``).
    model_name: TensorName
    #: A version to pin (``/versions/{v}``); None: the server's default.
    model_version: TensorName | None = None
    #: Input tensor names: FP32[B, num_dense] and INT64[B, num_sparse].
    dense_input: TensorName = "dense"
    sparse_input: TensorName = "sparse"
    #: The output that holds one score per row; None: the model's only output.
    output: TensorName | None = None
    #: Connecting to the server, and one batch's inference call, at most: a batch that takes
    #: longer fails (its baseline requests answer 500), it does not hang the inference thread.
    connect_timeout_s: Seconds = 1.0
    timeout_s: Seconds = 2.0
    #: At start, how long to wait for the server and the model to say ready.
    ready_timeout_s: Annotated[float, Meta(ge=0.0, le=3600.0)] = 30.0
    #: Keep-alive connections held to the server (the batcher calls one batch at a time).
    connections: Annotated[int, Meta(ge=1, le=64)] = 2
    #: Refuse to start unless the model's metadata declares exactly the inputs the worker
    #: sends. Off only for a server that declares none (the first batch then tells).
    check_metadata: bool = True


class MetadataTensor(msgspec.Struct, frozen=True, kw_only=True):
    """One input or output a model declares; ``-1`` in ``shape`` is a variable dimension."""

    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v2/models/{name}[/versions/{v}]``; servers add fields of their own (ignored)."""

    name: str
    versions: list[str] | None = None
    platform: str = ""
    inputs: list[MetadataTensor] = []
    outputs: list[MetadataTensor] = []


class OutputTensor(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    datatype: str
    shape: list[int]
    data: list[Any]


class InferResponse(msgspec.Struct, frozen=True, kw_only=True):
    model_name: str = ""
    model_version: str | None = None
    id: str | None = None
    outputs: list[OutputTensor]


_encoder = msgspec.json.Encoder()
_responses = msgspec.json.Decoder(InferResponse)
_metadata = msgspec.json.Decoder(ModelMetadata)


def expected_inputs(dense_name: str, num_dense: int, sparse_name: str,
                    num_sparse: int) -> list[MetadataTensor]:
    """The two tensors the worker sends for the fixed signature, as a model's metadata must
    declare them."""
    return [MetadataTensor(name=dense_name, datatype="FP32", shape=[-1, num_dense]),
            MetadataTensor(name=sparse_name, datatype="INT64", shape=[-1, num_sparse])]


def signature_inputs(args: list[Arg], names: dict[str, str] | None = None) -> list[MetadataTensor]:
    """The tensors the worker sends for a model spec (its `workers.features.Arg` list), as
    the model's metadata must declare them, a varying dimension as ``-1``; ``names`` renames
    some (the fixed signature's ``dense`` and ``sparse`` to ``model.oip.dense_input`` and
    ``sparse_input``). A multi-hot input is two tensors, ``{name}_values`` and
    ``{name}_offsets``, both ``[-1]``."""
    names = names or {}
    return [MetadataTensor(name=names.get(a.name, a.name), datatype=DATATYPES[a.dtype],
                           shape=[-1 if d is None else d for d in a.shape]) for a in args]


def encode_infer(inputs: list[tuple[str, np.ndarray]], output: str | None) -> bytes:
    """The JSON body of one inference request: each array a tensor of its shape and datatype
    (row-major ``data``); ``output`` asks for that output only (None: the server's default)."""
    tensors = []
    for name, array in inputs:
        datatype = DATATYPES.get(array.dtype)
        if datatype is None:
            raise OipError(f"input `{name}`: dtype {array.dtype} has no OIP datatype here")
        tensors.append({"name": name, "shape": list(array.shape), "datatype": datatype,
                        "data": array.ravel().tolist()})
    body: dict[str, Any] = {"inputs": tensors}
    if output is not None:
        body["outputs"] = [{"name": output}]
    return _encoder.encode(body)


def decode_scores(body: bytes, output: str | None, rows: int) -> np.ndarray:
    """``float32[rows]`` scores from an inference response: the output named ``output`` (None:
    the only one), of shape ``[rows]`` or ``[rows, 1]`` and as many values."""
    try:
        response = _responses.decode(body)
    except msgspec.DecodeError as exc:
        raise OipError(f"inference response: {exc}") from None
    outputs = response.outputs
    if output is None:
        if len(outputs) != 1:
            raise OipError(f"`$.outputs`: {len(outputs)} outputs "
                           f"({', '.join(o.name for o in outputs)}); name the score output "
                           "(`model.oip.output`)")
        index = 0
    else:
        matches = [i for i, o in enumerate(outputs) if o.name == output]
        if not matches:
            raise OipError(f"`$.outputs`: no output named {output!r} "
                           f"(got {', '.join(o.name for o in outputs) or 'none'})")
        index = matches[0]
    tensor = outputs[index]
    where = f"`$.outputs[{index}]`"
    if tensor.datatype not in SCORE_DATATYPES:
        raise OipError(f"{where}.datatype: {tensor.datatype} is not numeric")
    if tensor.shape not in ([rows], [rows, 1]):
        raise OipError(f"{where}.shape: {tensor.shape}; expected [{rows}] or [{rows}, 1], one "
                       "score per row")
    if len(tensor.data) != rows:
        raise OipError(f"{where}.data: {len(tensor.data)} values for shape {tensor.shape}")
    try:
        scores = np.asarray(tensor.data, dtype=np.float32)
    except (TypeError, ValueError):
        raise OipError(f"{where}.data: not all numbers") from None
    if not np.isfinite(scores).all():
        raise OipError(f"{where}.data: a score is not finite")
    return scores


def decode_metadata(body: bytes) -> ModelMetadata:
    try:
        return _metadata.decode(body)
    except msgspec.DecodeError as exc:
        raise OipError(f"model metadata: {exc}") from None


def check_metadata(meta: ModelMetadata, expected: list[MetadataTensor],
                   output: str | None) -> None:
    """Refuse, naming the field, a model whose declared inputs are not exactly the tensors the
    worker sends (same names, datatypes, and shapes where ``-1`` matches any size), or that
    lacks the configured ``output``. A model that declares no inputs cannot be checked, and is
    refused too: the operator declares them, or turns the check off knowingly."""
    if not meta.inputs:
        raise OipError(f"model {meta.name!r} declares no inputs in its metadata, so the worker "
                       "cannot check what it will send; declare them on the server (e.g. "
                       "`inputs` in MLServer's model-settings.json, Triton's config.pbtxt) or set "
                       "`model.oip.check_metadata = false`")
    declared = {t.name: (i, t) for i, t in enumerate(meta.inputs)}
    for want in expected:
        if want.name not in declared:
            raise OipError(f"model {meta.name!r} has no input {want.name!r} (it declares "
                           f"{', '.join(declared)}); the worker sends {want.name!r} "
                           f"{want.datatype}{want.shape}")
        i, got = declared[want.name]
        where = f"model {meta.name!r} `inputs[{i}]` ({got.name})"
        if got.datatype != want.datatype:
            raise OipError(f"{where}.datatype: {got.datatype}; the worker sends "
                           f"{want.datatype}")
        if not _shape_matches(got.shape, want.shape):
            raise OipError(f"{where}.shape: {got.shape}; the worker sends {want.shape} "
                           "(-1: the batch)")
    extra = [t.name for t in meta.inputs if t.name not in {w.name for w in expected}]
    if extra:
        raise OipError(f"model {meta.name!r} takes input {extra[0]!r} that the worker does not "
                       f"send (it sends {', '.join(w.name for w in expected)})")
    if output is not None and meta.outputs and output not in {o.name for o in meta.outputs}:
        raise OipError(f"model {meta.name!r} has no output {output!r} (`model.oip.output`; it "
                       f"declares {', '.join(o.name for o in meta.outputs)})")


def _shape_matches(declared: list[int], sent: list[int]) -> bool:
    """A declared shape fits what is sent: same rank, each dimension equal or variable."""
    if len(declared) != len(sent):
        return False
    return all(d == -1 or s == -1 or d == s for d, s in zip(declared, sent, strict=True))
