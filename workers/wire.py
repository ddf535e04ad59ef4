"""The ranking endpoint's two encodings, and which one a request asked for.

JSON (`workers.api`) is for people, curl and tools, and stays the default. msgpack
(``Content-Type: application/msgpack``) is what `RankingClient` sends: the header fields of
JSON (`RankHeader`) and the candidates as columns, each column the raw little-endian bytes of
a numpy array with its dtype and shape (`Array`). A worker then reads 2,000 candidates with a
few copies into numpy and one vectorised bounds check per column, where JSON parses 20,000
numbers from text, builds 2,000 structs and walks them again to make the model's arrays
(`surplus bench transport` measures both).

The columns of a msgpack request (``n`` candidates, ``k`` sparse ids each, ``d`` dense values):

========  ============  ===========================  =================================
field     shape         dtype                        each value
========  ============  ===========================  =================================
ids       ``[n]``       ``<i8``                      0 .. 2**63-1
priors    ``[n]``       ``<f8`` or ``<f4``           -1e9 .. 1e9
sparse    ``[n, k]``    ``<i4`` or ``<i8``           0 .. 2**31-1
dense     ``[d]``       ``<f8`` or ``<f4``           -1e9 .. 1e9
========  ============  ===========================  =================================

A model that declares its inputs (``[[model.inputs]]``, `workers.features`) takes them from
``features``, a map of input name to an `Array` (``[d]`` for the request, ``[n, d]`` per
candidate) or, for multi-hot ids, to ``{"values": Array, "offsets": Array}``; JSON sends the
same map with lists (`model_rows` reads either by the kind the spec declares). ``dense`` and
``sparse`` are then left out, or stay the inputs named ``dense`` and ``sparse``.

The bounds are `workers.api`'s, so both encodings accept the same requests, with one
exception: a msgpack request gives every candidate the same number of sparse ids (one width,
``k``), which is all a model takes anyway. The response is the same `RankResponse` struct in
msgpack when the Accept header ranks msgpack at least as high as JSON; error bodies are JSON
whatever was asked, since people read them. Every refusal is a `ContractError` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from msgspec import Meta, Struct

from schemas.codec import DEFAULT_MAX_BYTES, ContractError
from workers.api import (
    API_VERSION,
    MAX_CANDIDATES,
    MAX_DENSE,
    MAX_SPARSE_IDS,
    Candidate,
    Features,
    RankHeader,
    RankRequest,
    RankResponse,
    check_header,
    decode_request,
    decode_response,
    decode_strict,
    encode,
)
from workers.features import (
    FeatureError,
    Input,
    Jagged,
    Part,
    Rows,
    Signature,
    check_candidate_dense,
    check_multi_hot,
    check_request_dense,
    check_sparse,
)

Encoding = Literal["json", "msgpack"]
JSON_TYPE = "application/json"
MSGPACK_TYPE = "application/msgpack"
CONTENT_TYPES: dict[Encoding, str] = {"json": JSON_TYPE, "msgpack": MSGPACK_TYPE}
#: The Accept a msgpack-speaking client sends: msgpack, or JSON where that is all there is.
ACCEPT_MSGPACK = f"{MSGPACK_TYPE}, {JSON_TYPE};q=0.5"
#: The media types of each encoding (msgpack has three spellings in use), for Content-Type
#: and Accept alike.
_TYPES: dict[str, Encoding] = {
    JSON_TYPE: "json", MSGPACK_TYPE: "msgpack", "application/x-msgpack": "msgpack",
    "application/vnd.msgpack": "msgpack"}
#: A body may also declare a form: ``curl -d`` does when it is told nothing, and no form is a
#: ranking request, so it is read as the JSON it always is.
_READS: dict[str, Encoding] = {**_TYPES, "application/x-www-form-urlencoded": "json"}


def request_encoding(content_type: str | None) -> Encoding | None:
    """The encoding a body declares by its Content-Type (parameters such as ``charset``
    ignored; none declared: JSON), or None for a type the endpoint does not read (a 415)."""
    if content_type is None or not content_type.strip():
        return "json"
    media = content_type.split(";", 1)[0].strip().lower()
    return _READS.get(media)


def response_encoding(accept: str | None) -> Encoding:
    """msgpack when the Accept header names a msgpack type with a q-value above zero and at
    least JSON's; JSON otherwise (no header, ``*/*``, a type we do not serve, nonsense), so
    curl and browsers get what they can show. A range's q-value is its most specific match's."""
    if not accept:
        return "json"
    best: dict[Encoding, tuple[int, float]] = {}  # encoding -> (specificity, q)
    for item in accept.split(","):
        media, *params = (part.strip().lower() for part in item.split(";"))
        q = 1.0
        for param in params:
            key, _, raw = param.partition("=")
            if key.strip() == "q":
                try:
                    q = min(max(float(raw), 0.0), 1.0)
                except ValueError:
                    q = 0.0
        for encoding in ("json", "msgpack"):
            specificity = _specificity(media, encoding)
            if specificity and specificity > best.get(encoding, (0, 0.0))[0]:
                best[encoding] = (specificity, q)
    specificity, q_msgpack = best.get("msgpack", (0, 0.0))
    q_json = best.get("json", (0, 0.0))[1]
    named = specificity == 3     # a wildcard alone never asks for msgpack
    return "msgpack" if named and q_msgpack > 0.0 and q_msgpack >= q_json else "json"


def _specificity(media: str, encoding: Encoding) -> int:
    """3: the range names this encoding's type; 2: ``application/*``; 1: ``*/*``; 0: no match."""
    if media == "*/*":
        return 1
    if media == "application/*":
        return 2
    return 3 if _TYPES.get(media) == encoding else 0


class Array(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A numpy array on the wire: its dtype (``<i8``: little-endian int64), its shape, and its
    values' raw bytes in C order, which a reader turns back with `numpy.frombuffer`."""

    dtype: Annotated[str, Meta(max_length=8)]
    shape: Annotated[list[Annotated[int, Meta(ge=0, le=1 << 20)]], Meta(max_length=8)]
    data: bytes

    @classmethod
    def of(cls, array: np.ndarray) -> Array:
        """The wire form of `array` (its dtype should be little-endian, as every column's is)."""
        return cls(dtype=array.dtype.str, shape=list(array.shape), data=array.tobytes())


class JaggedArrays(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Multi-hot ids on the wire: the flat ids and ``n + 1`` offsets (`workers.features`)."""

    values: Array
    offsets: Array


class MsgpackRankRequest(RankHeader, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The msgpack body of a ranking request: `RankHeader`'s fields, the candidates' columns
    (the module docstring has their shapes, dtypes and bounds) and the model's named
    features, each an `Array` or `JaggedArrays` kept raw until its kind is known."""

    ids: Array
    priors: Array
    sparse: Array | None = None
    dense: Array | None = None
    features: Features = {}


@dataclass(frozen=True, slots=True)
class _Column:
    """What one column of `MsgpackRankRequest` may hold."""

    dtypes: tuple[str, ...]
    axes: tuple[tuple[str, int], ...]     # (what an axis counts, its most)
    low: float
    high: float

    @property
    def bounds(self) -> str:
        """The bounds as an error message says them (integers in full)."""
        if isinstance(self.low, int):
            return f"{self.low} to {self.high}"
        return f"{self.low:g} to {self.high:g}"


_CANDIDATES = ("candidates", MAX_CANDIDATES)
_COLUMNS = {
    "ids": _Column(("<i8",), (_CANDIDATES,), 0, 2**63 - 1),
    "priors": _Column(("<f8", "<f4"), (_CANDIDATES,), -1e9, 1e9),
    "sparse": _Column(("<i4", "<i8"), (_CANDIDATES, ("sparse ids", MAX_SPARSE_IDS)),
                      0, 2**31 - 1),
    "dense": _Column(("<f8", "<f4"), (("dense values", MAX_DENSE),), -1e9, 1e9),
}


@dataclass(frozen=True, slots=True, eq=False)
class ColumnarRequest:
    """A ranking request decoded from msgpack: the header of `RankRequest` and its candidates
    as numpy columns, read-only views of the body (the worker copies what it batches).

    ``ids`` int64[n], ``priors`` float[n], ``sparse`` int[n, k], ``dense`` float[d], with the
    dtypes that were sent (one of each column's, see the module docstring).
    """

    request_id: str
    segment: str
    value: float
    deadline_ms: float
    base_count: int
    gain: float | None
    ids: np.ndarray
    priors: np.ndarray
    sparse: np.ndarray
    dense: np.ndarray
    v: int = API_VERSION
    #: The model's named features, raw msgpack (`model_rows` reads them by their kind).
    features: Mapping[str, msgspec.Raw] = field(default_factory=dict)

    @property
    def candidate_count(self) -> int:
        """How many candidates were sent."""
        return len(self.ids)

    @property
    def optional_count(self) -> int:
        """How many candidates are optional RMA extra work."""
        return len(self.ids) - self.base_count

    def to_request(self) -> RankRequest:
        """The same request in the JSON shape, one `Candidate` struct per candidate: for code
        that wants the structs (it pays the per-candidate cost the columns avoid)."""
        candidates = [Candidate(id=i, sparse=s, prior=p) for i, s, p in
                      zip(self.ids.tolist(), self.sparse.tolist(), self.priors.tolist(),
                          strict=True)]
        return RankRequest(v=self.v, request_id=self.request_id, segment=self.segment,
                           value=self.value, deadline_ms=self.deadline_ms,
                           base_count=self.base_count, gain=self.gain,
                           dense=self.dense.tolist(), candidates=candidates,
                           features=encode_features(
                               {k: _any_feature(v, f"$.features.{k}")
                                for k, v in self.features.items()}, "json"))


#: A decoded ranking request, whichever encoding it came in: what a worker scores.
RequestBody = RankRequest | ColumnarRequest


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
_msgpack_array = msgspec.msgpack.Decoder(Array)
_msgpack_jagged = msgspec.msgpack.Decoder(JaggedArrays)
_ANY_NUMBER = ("<f8", "<f4", "<i8", "<i4")
_INTEGER = ("<i8", "<i4")


def _feature(inp: Input, raw: msgspec.Raw, n: int, path: str, *, msgpack: bool) -> Part:
    """One named feature of a request, read by its input's kind and checked against it."""
    if inp.kind == "multi_hot":
        if msgpack:
            jagged = _decode(_msgpack_jagged, raw, path)
            values = _buffer(jagged.values, f"{path}.values", _INTEGER)
            offsets = _buffer(jagged.offsets, f"{path}.offsets", _INTEGER)
        else:
            lists = _decode(_JSON_FEATURES["multi_hot"], raw, path)
            values, offsets = (_ints(lists.values, f"{path}.values"),
                               _ints(lists.offsets, f"{path}.offsets"))
        return check_multi_hot(inp, values, offsets, n, path)
    if msgpack:
        array = _buffer(_decode(_msgpack_array, raw, path), path,
                        _INTEGER if inp.ids else _ANY_NUMBER)
    else:
        decoded = _decode(_JSON_FEATURES[inp.kind], raw, path)
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


def _decode(decoder: msgspec.json.Decoder[Any] | msgspec.msgpack.Decoder[Any],
            raw: msgspec.Raw, path: str) -> Any:
    """A raw feature decoded as its kind's shape; the error's ``$`` is the feature's path."""
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise FeatureError(str(exc).replace("`$", f"`{path}")) from None
    except msgspec.DecodeError as exc:
        raise FeatureError(f"`{path}`: {exc}") from None


def _ints(values: list[int], path: str) -> np.ndarray:
    """JSON integers as an integer array (one past int64 makes numpy's object array)."""
    array = np.array(values) if values else np.zeros(0, np.int64)
    if array.dtype.kind not in "iu":
        raise FeatureError(f"`{path}`: an id beyond 64 bits")
    return array


def _any_feature(raw: msgspec.Raw, path: str) -> FeatureValue:
    """A msgpack feature as the client passed it, whatever its kind (`to_request`)."""
    try:
        array = _msgpack_array.decode(raw)
    except msgspec.ValidationError:
        jagged = _decode(_msgpack_jagged, raw, path)
        return Jagged(_buffer(jagged.values, f"{path}.values", _INTEGER),
                      _buffer(jagged.offsets, f"{path}.offsets", _INTEGER))
    return _buffer(array, path, _ANY_NUMBER)


_msgpack_request_decoder = msgspec.msgpack.Decoder(MsgpackRankRequest, strict=True)
_msgpack_encoder = msgspec.msgpack.Encoder()


def decode_columnar_request(payload: bytes | bytearray | memoryview,
                            max_bytes: int = DEFAULT_MAX_BYTES) -> ColumnarRequest:
    """Strictly decode a msgpack ranking request; ContractError names the bad field (a
    column's dtype, shape, byte count, or its first value out of bounds, by index)."""
    try:
        wire = decode_strict(_msgpack_request_decoder, "RankRequest", payload, max_bytes)
    except ContractError as exc:
        if bytes(payload[:1]) == b"{":      # msgpack reads it as the number 123
            raise ContractError("RankRequest", f"{exc.reason}: the body looks like JSON; "
                                               f"declare it as {JSON_TYPE}") from None
        raise
    assert isinstance(wire, MsgpackRankRequest)
    ids = _column("ids", wire.ids)
    priors = _column("priors", wire.priors)
    n = len(ids)
    # Left out (a model that takes only named features): no dense values, no sparse ids.
    sparse = (np.zeros((n, 0), np.int32) if wire.sparse is None
              else _column("sparse", wire.sparse))
    dense = np.zeros(0) if wire.dense is None else _column("dense", wire.dense)
    for name, column in (("priors", priors), ("sparse", sparse)):
        if len(column) != n:
            raise ContractError("RankRequest", f"`$.{name}.shape` is {list(column.shape)} but "
                                               f"`$.ids` has {n} candidates: one row each")
    check_header(wire, n)
    return ColumnarRequest(v=wire.v, request_id=wire.request_id, segment=wire.segment,
                           value=wire.value, deadline_ms=wire.deadline_ms,
                           base_count=wire.base_count, gain=wire.gain, ids=ids, priors=priors,
                           sparse=sparse, dense=dense, features=wire.features)


def _column(name: str, array: Array) -> np.ndarray:
    """One column as a read-only numpy view of its bytes, once its dtype, shape, size and
    values are what `_COLUMNS` allows."""
    spec = _COLUMNS[name]
    if array.dtype not in spec.dtypes:
        raise ContractError("RankRequest", f"`$.{name}.dtype` is {array.dtype!r}; expected "
                                           f"{' or '.join(map(repr, spec.dtypes))}")
    if len(array.shape) != len(spec.axes):
        raise ContractError("RankRequest", f"`$.{name}.shape` is {array.shape}; expected "
                                           f"[{', '.join(axis for axis, _ in spec.axes)}]")
    for size, (axis, most) in zip(array.shape, spec.axes, strict=True):
        if size > most:
            raise ContractError("RankRequest", f"`$.{name}.shape` has {size} {axis}; at most "
                                               f"{most}")
    try:
        values = _buffer(array, f"$.{name}", spec.dtypes)
    except FeatureError as exc:
        raise ContractError("RankRequest", str(exc)) from None
    # min and max are two passes with no temporary array; NaN makes either comparison false.
    if values.size and not (spec.low <= values.min() and values.max() <= spec.high):
        flat = int(np.flatnonzero(~((values >= spec.low) & (values <= spec.high)))[0])
        where = "".join(f"[{i}]" for i in np.unravel_index(flat, values.shape))
        raise ContractError("RankRequest", f"`$.{name}{where}` is {values.flat[flat].item()!r}; "
                                           f"expected {spec.bounds}")
    return values


def _buffer(array: Array, path: str, dtypes: tuple[str, ...]) -> np.ndarray:
    """An `Array` as a read-only numpy view of its bytes, once its dtype is one of `dtypes`
    and its byte count is its shape's; FeatureError names `path` otherwise."""
    if array.dtype not in dtypes:
        raise FeatureError(f"`{path}.dtype` is {array.dtype!r}; expected "
                           f"{' or '.join(map(repr, dtypes))}")
    dtype = np.dtype(array.dtype)
    expected = int(np.prod(array.shape)) * dtype.itemsize
    if len(array.data) != expected:
        raise FeatureError(f"`{path}.data` has {len(array.data)} bytes; shape {array.shape} "
                           f"of {array.dtype!r} takes {expected}")
    return np.frombuffer(array.data, dtype=dtype).reshape(array.shape)


#: A feature as a caller passes it: an array (``[d]`` for the request, ``[n, ...]`` one row per
#: candidate) or multi-hot ids (`workers.features.Jagged`).
FeatureValue = np.ndarray | Jagged


def check_feature_rows(features: Mapping[str, FeatureValue], n: int) -> None:
    """Refuse, naming it, a feature a caller passes with other than one row per candidate
    (a 2-D array or multi-hot ids) or of more than two dimensions: the client trims every
    per-candidate feature with the candidates it sends, so the rows must line up."""
    for name, value in features.items():
        rows = len(value) if isinstance(value, Jagged) else (
            value.shape[0] if value.ndim == 2 else None)
        if not isinstance(value, Jagged) and value.ndim not in (1, 2):
            raise ContractError("RankRequest", f"`$.features.{name}` has shape "
                                               f"{list(value.shape)}; expected [d] for the "
                                               "request or [n, d], one row per candidate")
        if rows is not None and rows != n:
            raise ContractError("RankRequest", f"`$.features.{name}` has {rows} rows but "
                                               f"{n} candidates were given: one row each")


def take_features(features: Mapping[str, FeatureValue],
                  count: int) -> dict[str, FeatureValue]:
    """The features of a request's first `count` candidates (the request's own vectors
    whole): what goes with a request the client trimmed."""
    return {name: value.take(0, count) if isinstance(value, Jagged)
            else value[:count] if value.ndim == 2 else value
            for name, value in features.items()}


def encode_features(features: Mapping[str, FeatureValue],
                    encoding: Encoding) -> dict[str, msgspec.Raw]:
    """Each feature in the wire form of `encoding`: JSON lists, or msgpack `Array` columns of
    raw little-endian bytes (integers as int32 where they fit, as the sparse column does);
    ContractError names a feature no column carries."""
    out = {}
    for name, value in features.items():
        path = f"$.features.{name}"
        if isinstance(value, Jagged):
            values, offsets = (_wire(value.values, f"{path}.values"),
                               _wire(value.offsets, f"{path}.offsets"))
            out[name] = msgspec.Raw(
                _json_encoder.encode({"values": values.tolist(), "offsets": offsets.tolist()})
                if encoding == "json" else _msgpack_encoder.encode(
                    JaggedArrays(values=Array.of(values), offsets=Array.of(offsets))))
        else:
            array = _wire(value, path)
            out[name] = msgspec.Raw(_json_encoder.encode(array.tolist()) if encoding == "json"
                                    else _msgpack_encoder.encode(Array.of(array)))
    return out


def _wire(array: np.ndarray, path: str) -> np.ndarray:
    """`array` in a column's dtype: little-endian float32/float64, integers as int32 where all
    fit and int64 otherwise."""
    array = np.asarray(array)
    kind = array.dtype.kind
    if kind == "f":
        return array.astype("<f4" if array.dtype.itemsize <= 4 else "<f8", copy=False)
    if kind not in "iu" or (kind == "u" and array.size and array.max() > 2**63 - 1):
        raise ContractError("RankRequest", f"`{path}` holds {array.dtype.name}; expected "
                                           "numbers (floats, or integers within int64)")
    narrow = not array.size or (array.min() >= -2**31 and array.max() <= 2**31 - 1)
    return array.astype("<i4" if narrow else "<i8", copy=False)


_json_encoder = msgspec.json.Encoder()


def encode_columnar_request(request: RankRequest,
                            features: Mapping[str, FeatureValue] | None = None) -> bytes:
    """The msgpack body of a request. Values out of the contract's bounds are sent as they are,
    for the worker to refuse by name as it does in JSON; what no column can carry is refused
    here, by name: candidates of different sparse widths, a non-number, an integer beyond int64.
    """
    candidates = request.candidates
    n = len(candidates)
    ids = _numbers([c.id for c in candidates], "iu", "$.candidates[{}].id")
    priors = _numbers([c.prior for c in candidates], "iuf", "$.candidates[{}].prior")
    dense = _numbers(request.dense, "iuf", "$.dense[{}]")
    rows = [c.sparse for c in candidates]
    width = len(rows[0]) if n else 0
    try:
        sparse = _numbers(rows, "iu", "$.candidates[{}].sparse")
    except ValueError as exc:
        if isinstance(exc, ContractError):
            raise
        ragged = next(i for i, row in enumerate(rows) if len(row) != width)
        raise ContractError("RankRequest", f"`$.candidates[{ragged}].sparse` has "
                                           f"{len(rows[ragged])} ids but `$.candidates[0]"
                                           f".sparse` has {width}: msgpack carries one width "
                                           f"per request") from None
    # The contract's ids fit int32, half the bytes; anything else travels as int64 to be
    # refused by the worker with its index.
    narrow = not sparse.size or (sparse.min() >= -2**31 and sparse.max() <= 2**31 - 1)
    return _msgpack_encoder.encode(MsgpackRankRequest(
        v=request.v, request_id=request.request_id, segment=request.segment,
        value=request.value, deadline_ms=request.deadline_ms, base_count=request.base_count,
        gain=request.gain, ids=Array.of(ids.astype("<i8")),
        priors=Array.of(priors.astype("<f8")),
        sparse=Array.of(sparse.astype("<i4" if narrow else "<i8").reshape(n, width)),
        dense=Array.of(dense.astype("<f8")),
        features=encode_features(features, "msgpack") if features else {}))


def _numbers(values: Sequence[Any], kinds: str, path: str) -> np.ndarray:
    """`values` (numbers, or rows of them) as one array whose dtype kind is among `kinds`
    (numpy's: ``i`` signed, ``u`` unsigned, ``f`` float) and whose integers fit int64;
    ContractError names the first value that is not (``path`` formatted with its index).
    Rows of different lengths raise numpy's ValueError for the caller to name."""
    array = np.array(values)
    if not array.size:
        return array
    if array.dtype.kind in kinds and not (array.dtype.kind == "u" and array.max() > 2**63 - 1):
        return array
    for i, value in enumerate(values):
        for number in value if isinstance(value, list) else [value]:
            ok = ((isinstance(number, int | np.integer) and -2**63 <= number <= 2**63 - 1)
                  or ("f" in kinds and isinstance(number, float | np.floating)))
            if not ok or isinstance(number, bool | np.bool_):
                raise ContractError("RankRequest", f"`{path.format(i)}` holds {number!r}; "
                                                   f"expected {_KIND_NAMES[kinds]}")
    raise ContractError("RankRequest", f"`{path.format('')}` holds values no "
                                       f"{_KIND_NAMES[kinds]} column carries")


_KIND_NAMES = {"iu": "an integer within int64", "iuf": "a number"}


def encode_rank_request(request: RankRequest, encoding: Encoding,
                        features: Mapping[str, FeatureValue] | None = None) -> bytes:
    """A request's body in either encoding, with the model's named `features` (numpy arrays
    and `Jagged` multi-hot ids; `check_feature_rows` says how they must line up)."""
    if encoding == "msgpack":
        return encode_columnar_request(request, features)
    if features:
        request = msgspec.structs.replace(request, features=encode_features(features, "json"))
    return encode(request)


def decode_rank_request(payload: bytes | bytearray | memoryview, encoding: Encoding,
                        max_bytes: int = DEFAULT_MAX_BYTES) -> RequestBody:
    """A request body in the encoding its Content-Type declared (`request_encoding`)."""
    if encoding == "json":
        return decode_request(payload, max_bytes)
    return decode_columnar_request(payload, max_bytes)


def encode_rank_response(response: RankResponse, encoding: Encoding) -> bytes:
    """A response's body in the encoding the caller's Accept chose (`response_encoding`)."""
    return encode(response) if encoding == "json" else _msgpack_encoder.encode(response)


def decode_rank_response(payload: bytes | bytearray | memoryview, content_type: str | None,
                         max_bytes: int = DEFAULT_MAX_BYTES) -> RankResponse:
    """A response body in the encoding its Content-Type declares (none: JSON)."""
    encoding = request_encoding(content_type)
    if encoding is None:
        raise ContractError("RankResponse", f"content type {content_type!r} is neither JSON "
                                            f"nor msgpack")
    return decode_response(payload, max_bytes, msgpack=encoding == "msgpack")


__all__ = [
    "ACCEPT_MSGPACK", "CONTENT_TYPES", "JSON_TYPE", "MSGPACK_TYPE", "Array", "ColumnarRequest",
    "Encoding", "FeatureValue", "JaggedArrays", "MsgpackRankRequest", "RequestBody",
    "ShapeMismatch", "check_feature_rows", "decode_columnar_request", "decode_rank_request",
    "decode_rank_response", "encode_columnar_request", "encode_features", "encode_rank_request",
    "encode_rank_response", "model_inputs", "model_rows", "request_encoding",
    "response_encoding", "take_features",
]
