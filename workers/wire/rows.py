"""A decoded request's candidate rows as a model takes them (`model_rows`): one part per
input of its signature, from ``$.features`` or, for the fixed signature, from ``$.dense`` and
the candidates' sparse ids; what the model cannot take is refused by name (`ShapeMismatch`)."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
from msgspec import Struct

from workers.features import (
    FeatureError,
    Input,
    Part,
    Rows,
    Signature,
    check_candidate_dense,
    check_multi_hot,
    check_request_dense,
    check_sparse,
)
from workers.wire.arrays import (
    ANY_NUMBER,
    ARRAY_DECODER,
    INTEGER,
    JAGGED_DECODER,
    buffer_view,
    decode_raw,
)
from workers.wire.columns import ColumnarRequest, RequestBody

#: A request the contract accepts but the model cannot take (a worker answers 422); the
#: message names the field and what the model takes.
ShapeMismatch = FeatureError


def model_inputs(request: RequestBody, num_dense: int, num_sparse: int,
                 model: str) -> tuple[np.ndarray, np.ndarray]:
    """A request's dense vector as float32[num_dense] and its candidates' sparse ids as
    int64[n, num_sparse]: `model_rows` for the fixed signature."""
    rows = model_rows(request, Signature.fixed(num_dense, num_sparse), model)
    dense, sparse = rows.parts
    assert isinstance(dense, np.ndarray) and isinstance(sparse, np.ndarray)
    return dense, sparse


def model_rows(request: RequestBody, signature: Signature, model: str) -> Rows:
    """A request's candidate rows as the `model` named takes them: one part per input of its
    signature, checked and in the model's dtypes (`workers.features`). From msgpack columns
    this is a cast at most; from JSON it walks every candidate's list, the per-candidate cost
    the columns avoid (`surplus bench transport` times both, decode included).

    An input comes from ``$.features`` under its name; the fixed signature's ``dense`` and
    ``sparse`` also from ``$.dense`` and the candidates' sparse ids, as before features
    existed. A feature the model does not take, or a field it has no input for, is refused:
    a value silently dropped would be a model scoring without what its caller meant it to.
    """
    columnar = isinstance(request, ColumnarRequest)
    n = (request.candidate_count if isinstance(request, ColumnarRequest)
         else len(request.candidates))
    names = signature.names()
    for name in request.features:
        if name not in names:
            raise ShapeMismatch(f"`$.features.{name}`: the {model} model takes no input named "
                                f"{name!r} (it takes {', '.join(names)})")
    parts: list[Part] = []
    legacy = set()
    for inp in signature.inputs:
        path = f"$.features.{inp.name}"
        fixed = ((inp.name, inp.kind) in (("dense", "request_dense"), ("sparse", "sparse")))
        if inp.name in request.features:
            if fixed and _legacy_given(request, inp.name):
                raise ShapeMismatch(f"`$.{inp.name}` and `{path}` are both given; send one")
            raw = request.features[inp.name]
            parts.append(_feature(inp, raw, n, path, msgpack=columnar))
        elif fixed:
            legacy.add(inp.name)
            parts.append(_legacy_dense(request, inp, model) if inp.name == "dense"
                         else _legacy_sparse(request, inp, model))
        else:
            raise ShapeMismatch(f"`{path}` is missing: the {model} model takes "
                                f"{inp.name} ({_describe(inp)})")
    for name in ("dense", "sparse"):
        if name not in legacy and _legacy_given(request, name):
            where = "$.dense" if name == "dense" else (
                "$.sparse" if columnar else "$.candidates[].sparse")
            raise ShapeMismatch(f"`{where}`: the {model} model takes no input named {name!r} "
                                f"(it takes {', '.join(names)}); send its inputs in "
                                "`$.features`")
    return Rows(n, tuple(parts), tuple(i.kind == "request_dense" for i in signature.inputs))


def _describe(inp: Input) -> str:
    """``13 float32 values per request``: what an input takes, for error messages."""
    what = f"{inp.model_dtype.name} {'ids' if inp.ids else 'values'}"
    if inp.kind == "multi_hot":
        return f"any number of {what} per candidate, as values and offsets"
    return f"{inp.size} {what} per {'request' if inp.kind == 'request_dense' else 'candidate'}"


def _legacy_given(request: RequestBody, name: str) -> bool:
    """Whether a request fills the fixed signature's field `name` (``dense``, ``sparse``)."""
    if name == "dense":
        return len(request.dense) > 0
    if isinstance(request, ColumnarRequest):
        return request.sparse.size > 0
    return any(c.sparse for c in request.candidates)


def _legacy_dense(request: RequestBody, inp: Input, model: str) -> np.ndarray:
    if len(request.dense) != inp.size:
        raise ShapeMismatch(f"`$.dense` has {len(request.dense)} values; the {model} model "
                            f"takes {inp.size}")
    return np.asarray(request.dense).astype(inp.model_dtype, copy=False)


def _legacy_sparse(request: RequestBody, inp: Input, model: str) -> np.ndarray:
    width = inp.size or 0
    if isinstance(request, ColumnarRequest):
        if request.sparse.shape[1] != width:
            raise ShapeMismatch(f"`$.sparse` has {request.sparse.shape[1]} ids per candidate; "
                                f"the {model} model takes {width}")
        return request.sparse.astype(inp.model_dtype, copy=False)
    for i, candidate in enumerate(request.candidates):
        if len(candidate.sparse) != width:
            raise ShapeMismatch(f"`$.candidates[{i}].sparse` has {len(candidate.sparse)} ids; "
                                f"the {model} model takes {width}")
    sparse = np.asarray([c.sparse for c in request.candidates], dtype=inp.model_dtype)
    return sparse.reshape(len(request.candidates), width)


class _JsonJagged(Struct, frozen=True, forbid_unknown_fields=True):
    values: list[int]
    offsets: list[int]


_JSON_FEATURES: dict[str, msgspec.json.Decoder[Any]] = {
    "request_dense": msgspec.json.Decoder(list[float]),
    "candidate_dense": msgspec.json.Decoder(list[list[float]]),
    "sparse": msgspec.json.Decoder(list[list[int]]),
    "multi_hot": msgspec.json.Decoder(_JsonJagged),
}


def _feature(inp: Input, raw: msgspec.Raw, n: int, path: str, *, msgpack: bool) -> Part:
    """One named feature of a request, read by its input's kind and checked against it."""
    if inp.kind == "multi_hot":
        if msgpack:
            jagged = decode_raw(JAGGED_DECODER, raw, path)
            values = buffer_view(jagged.values, f"{path}.values", INTEGER)
            offsets = buffer_view(jagged.offsets, f"{path}.offsets", INTEGER)
        else:
            lists = decode_raw(_JSON_FEATURES["multi_hot"], raw, path)
            values, offsets = (_ints(lists.values, f"{path}.values"),
                               _ints(lists.offsets, f"{path}.offsets"))
        return check_multi_hot(inp, values, offsets, n, path)
    if msgpack:
        array = buffer_view(decode_raw(ARRAY_DECODER, raw, path), path,
                        INTEGER if inp.ids else ANY_NUMBER)
    else:
        decoded = decode_raw(_JSON_FEATURES[inp.kind], raw, path)
        try:
            array = np.array(decoded)
        except ValueError:
            raise FeatureError(f"`{path}`: rows of different lengths; every candidate's row "
                               f"has {inp.size}") from None
        if array.ndim == 1 and not array.size and inp.kind != "request_dense":
            array = array.reshape(0, inp.size or 0)
    if inp.kind == "request_dense":
        return check_request_dense(inp, array, path)
    if inp.kind == "candidate_dense":
        return check_candidate_dense(inp, array, n, path)
    return check_sparse(inp, array, n, path)


def _ints(values: list[int], path: str) -> np.ndarray:
    """JSON integers as an integer array (one past int64 makes numpy's object array)."""
    array = np.array(values) if values else np.zeros(0, np.int64)
    if array.dtype.kind not in "iu":
        raise FeatureError(f"`{path}`: an id beyond 64 bits")
    return array
