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

The package is split by concern: `media` (which encoding), `arrays` (a numpy array on the
wire), `columns` (the msgpack request), `feature_codec` (the model's named features) and
`rows` (a request's rows as the model takes them); every name is importable from here.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from schemas.codec import DEFAULT_MAX_BYTES, ContractError
from workers.api import RankRequest, RankResponse, decode_request, decode_response, encode
from workers.wire.arrays import MSGPACK_ENCODER, Array, JaggedArrays
from workers.wire.columns import (
    ColumnarRequest,
    MsgpackRankRequest,
    RequestBody,
    decode_columnar_request,
    encode_columnar_request,
)
from workers.wire.feature_codec import (
    FeatureValue,
    check_feature_rows,
    encode_features,
    take_features,
)
from workers.wire.media import (
    ACCEPT_MSGPACK,
    CONTENT_TYPES,
    JSON_TYPE,
    MSGPACK_TYPE,
    Encoding,
    request_encoding,
    response_encoding,
)
from workers.wire.rows import ShapeMismatch, model_inputs, model_rows


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
    return encode(response) if encoding == "json" else MSGPACK_ENCODER.encode(response)


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
