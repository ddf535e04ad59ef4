"""The msgpack body of a ranking request: the header fields and the candidates as numpy
columns (the package docstring has their shapes, dtypes and bounds), decoded strictly into a
`ColumnarRequest` and encoded from a `RankRequest`; every refusal names the field."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

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
    check_header,
    decode_strict,
)
from workers.features import FeatureError
from workers.wire.arrays import (
    MSGPACK_ENCODER,
    Array,
    buffer_view,
)
from workers.wire.feature_codec import FeatureValue, any_feature, encode_features
from workers.wire.media import JSON_TYPE


class MsgpackRankRequest(RankHeader, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The msgpack body of a ranking request: `RankHeader`'s fields, the candidates' columns
    (`workers.wire`'s docstring has their shapes, dtypes and bounds) and the model's named
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
    dtypes that were sent (one of each column's, see `workers.wire`'s docstring).
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
    report_room: bool = False
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
                           report_room=self.report_room, dense=self.dense.tolist(),
                           candidates=candidates,
                           features=encode_features(
                               {k: any_feature(v, f"$.features.{k}")
                                for k, v in self.features.items()}, "json"))


#: A decoded ranking request, whichever encoding it came in: what a worker scores.
RequestBody = RankRequest | ColumnarRequest


_msgpack_request_decoder = msgspec.msgpack.Decoder(MsgpackRankRequest, strict=True)


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
                           sparse=sparse, dense=dense, features=wire.features,
                           report_room=wire.report_room)


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
        values = buffer_view(array, f"$.{name}", spec.dtypes)
    except FeatureError as exc:
        raise ContractError("RankRequest", str(exc)) from None
    # min and max are two passes with no temporary array; NaN makes either comparison false.
    if values.size and not (spec.low <= values.min() and values.max() <= spec.high):
        flat = int(np.flatnonzero(~((values >= spec.low) & (values <= spec.high)))[0])
        where = "".join(f"[{i}]" for i in np.unravel_index(flat, values.shape))
        raise ContractError("RankRequest", f"`$.{name}{where}` is {values.flat[flat].item()!r}; "
                                           f"expected {spec.bounds}")
    return values


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
    return MSGPACK_ENCODER.encode(MsgpackRankRequest(
        v=request.v, request_id=request.request_id, segment=request.segment,
        value=request.value, deadline_ms=request.deadline_ms, base_count=request.base_count,
        gain=request.gain, report_room=request.report_room, ids=Array.of(ids.astype("<i8")),
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
