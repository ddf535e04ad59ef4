"""The model's named features as a caller passes them (`FeatureValue`: numpy arrays, and
`Jagged` multi-hot ids) and on the wire: checked to line up with the candidates, trimmed with
them, and encoded as JSON lists or msgpack `Array` columns."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
import numpy as np

from schemas.codec import ContractError
from workers.features import Jagged
from workers.wire.arrays import (
    ANY_NUMBER,
    ARRAY_DECODER,
    INTEGER,
    JAGGED_DECODER,
    JSON_ENCODER,
    MSGPACK_ENCODER,
    Array,
    JaggedArrays,
    buffer_view,
    decode_raw,
)
from workers.wire.media import Encoding

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
                JSON_ENCODER.encode({"values": values.tolist(), "offsets": offsets.tolist()})
                if encoding == "json" else MSGPACK_ENCODER.encode(
                    JaggedArrays(values=Array.of(values), offsets=Array.of(offsets))))
        else:
            array = _wire(value, path)
            out[name] = msgspec.Raw(JSON_ENCODER.encode(array.tolist()) if encoding == "json"
                                    else MSGPACK_ENCODER.encode(Array.of(array)))
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


def any_feature(raw: msgspec.Raw, path: str) -> FeatureValue:
    """A msgpack feature as the client passed it, whatever its kind (`to_request`)."""
    try:
        array = ARRAY_DECODER.decode(raw)
    except msgspec.ValidationError:
        jagged = decode_raw(JAGGED_DECODER, raw, path)
        return Jagged(buffer_view(jagged.values, f"{path}.values", INTEGER),
                      buffer_view(jagged.offsets, f"{path}.offsets", INTEGER))
    return buffer_view(array, path, ANY_NUMBER)
