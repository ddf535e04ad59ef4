"""A numpy array on the wire (`Array`, `JaggedArrays` for multi-hot ids) and the reading
of one back: a read-only view of its bytes once its dtype and byte count are checked
(`buffer_view`), and the decoders and encoders the other wire modules share."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import numpy as np
from msgspec import Meta, Struct

from workers.features import FeatureError


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


ARRAY_DECODER = msgspec.msgpack.Decoder(Array)


JAGGED_DECODER = msgspec.msgpack.Decoder(JaggedArrays)


ANY_NUMBER = ("<f8", "<f4", "<i8", "<i4")


INTEGER = ("<i8", "<i4")


def decode_raw(decoder: msgspec.json.Decoder[Any] | msgspec.msgpack.Decoder[Any],
            raw: msgspec.Raw, path: str) -> Any:
    """A raw feature decoded as its kind's shape; the error's ``$`` is the feature's path."""
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise FeatureError(str(exc).replace("`$", f"`{path}")) from None
    except msgspec.DecodeError as exc:
        raise FeatureError(f"`{path}`: {exc}") from None


def buffer_view(array: Array, path: str, dtypes: tuple[str, ...]) -> np.ndarray:
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


MSGPACK_ENCODER = msgspec.msgpack.Encoder()


JSON_ENCODER = msgspec.json.Encoder()
