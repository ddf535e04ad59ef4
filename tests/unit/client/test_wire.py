"""The ranking endpoint's msgpack form: candidates as raw numpy columns that round-trip exactly,
every malformed body refused with the field named, and the encoding chosen by Content-Type
and Accept."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pytest

from schemas.codec import ContractError
from workers.api import (
    MAX_CANDIDATES,
    Candidate,
    RankRequest,
    RankResponse,
    ServerState,
    encode,
)
from workers.wire import (
    ACCEPT_MSGPACK,
    Array,
    ColumnarRequest,
    MsgpackRankRequest,
    ShapeMismatch,
    decode_columnar_request,
    decode_rank_request,
    decode_rank_response,
    encode_columnar_request,
    encode_rank_response,
    model_inputs,
    request_encoding,
    response_encoding,
)


def _request(n: int = 5, width: int = 3, seed: int = 0) -> RankRequest:
    rng = random.Random(seed)
    return RankRequest(
        request_id="r1", segment="new-users", value=1.5, deadline_ms=50.0, gain=0.25,
        dense=[rng.uniform(-5, 5) for _ in range(4)], base_count=min(2, n),
        candidates=[Candidate(id=rng.randrange(1 << 62),
                              sparse=[rng.randrange(1 << 31) for _ in range(width)],
                              prior=rng.random()) for _ in range(n)])


def test_request_round_trips_exactly_through_msgpack_columns() -> None:
    request = _request(n=7)
    decoded = decode_columnar_request(encode_columnar_request(request))
    assert isinstance(decoded, ColumnarRequest)
    assert decoded.to_request() == request
    assert (decoded.candidate_count, decoded.optional_count) == (7, 5)
    assert decoded.sparse.shape == (7, 3) and decoded.sparse.dtype == np.dtype("<i4")
    assert decoded.ids.dtype == np.dtype("<i8") and decoded.dense.shape == (4,)
    np.testing.assert_array_equal(decoded.sparse, [c.sparse for c in request.candidates])


def test_an_empty_request_and_candidates_without_sparse_ids_round_trip() -> None:
    for request in (_request(n=0), _request(n=3, width=0)):
        assert decode_columnar_request(encode_columnar_request(request)).to_request() == request


def test_msgpack_body_is_under_half_the_json_one_at_two_thousand_candidates() -> None:
    request = _request(n=2000, width=8)
    assert len(encode_columnar_request(request)) < len(encode(request)) / 2


def test_other_writers_dtypes_are_read_int64_sparse_and_float32_values() -> None:
    request = _request(n=4)
    wire = msgspec.msgpack.decode(encode_columnar_request(request), type=MsgpackRankRequest)
    sparse = np.asarray([c.sparse for c in request.candidates], dtype="<i8")
    other = msgspec.structs.replace(
        wire, sparse=Array.of(sparse),
        priors=Array.of(np.asarray([c.prior for c in request.candidates], dtype="<f4")),
        dense=Array.of(np.asarray(request.dense, dtype="<f4")))
    decoded = decode_columnar_request(msgspec.msgpack.encode(other))
    assert decoded.sparse.dtype == np.dtype("<i8")
    np.testing.assert_array_equal(decoded.sparse, sparse)
    np.testing.assert_allclose(decoded.priors, [c.prior for c in request.candidates], rtol=1e-6)


def _body() -> dict[str, Any]:
    """A valid msgpack request as a plain dict (columns as bytes), to break one field of."""
    return dict(msgspec.msgpack.decode(encode_columnar_request(_request(n=4))))


def _column(name: str, dtype: str, values: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(body: dict[str, Any]) -> None:
        array = np.asarray(values, dtype=dtype)
        body[name] = {"dtype": dtype, "shape": list(array.shape), "data": array.tobytes()}
    return mutate


def _set(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda body: body.update(fields)


def _set_in(name: str, **fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda body: body[name].update(fields)


def _drop(name: str) -> Callable[[dict[str, Any]], None]:
    return lambda body: body.pop(name)


@pytest.mark.parametrize(("mutate", "named"), [
    (_drop("request_id"), "`request_id`"),
    (_set(value="high"), "`$.value`"),
    (_set(deadline_ms=0.0), "`$.deadline_ms`"),
    (_set(extra=True), "`extra`"),
    (_set(v=2), "unknown API version 2 at `$.v`"),
    (_set(base_count=5), "`$.base_count` is 5 but only 4 candidates"),
    (_set_in("sparse", data="text"), "`$.sparse.data`"),
    (_set_in("sparse", unknown=1), "`unknown` - at `$.sparse`"),
    (_set_in("sparse", dtype=">i4"), "`$.sparse.dtype` is '>i4'"),
    (_set_in("sparse", dtype="<f8"), "`$.sparse.dtype` is '<f8'"),
    (_set_in("sparse", shape=[12]), "`$.sparse.shape` is [12]; expected [candidates, sparse"),
    (_set_in("sparse", shape=[4, 2]), "`$.sparse.data` has 48 bytes; shape [4, 2]"),
    (_set_in("sparse", shape=[-4, 3]), "`$.sparse.shape[0]`"),
    (_column("sparse", "<i8", [[1, 2, 3]] * 3 + [[1, -1, 3]]), "`$.sparse[3][1]` is -1"),
    (_column("sparse", "<i8", [[1, 2, 3]] * 3 + [[1, 2, 2**31]]),
     "`$.sparse[3][2]` is 2147483648; expected 0 to 2147483647"),
    (_column("priors", "<f8", [0.1, 0.2, np.nan, 0.4]), "`$.priors[2]` is nan"),
    (_column("priors", "<f8", [0.1, 0.2, 0.3]), "`$.priors.shape` is [3] but `$.ids` has 4"),
    (_column("dense", "<f4", [np.inf, 0.0]), "`$.dense[0]` is inf"),
    (_column("ids", "<i8", [1, 2, -3, 4]), "`$.ids[2]` is -3"),
    (_column("ids", "<u8", [1, 2, 3, 4]), "`$.ids.dtype` is '<u8'; expected '<i8'"),
    (_column("ids", "<i8", np.zeros(MAX_CANDIDATES + 1)), f"{MAX_CANDIDATES + 1} candidates; "
                                                          f"at most {MAX_CANDIDATES}"),
], ids=["missing-field", "wrong-type", "out-of-bounds", "unknown-field",
        "version", "base-count", "data-not-bytes", "unknown-array-field", "big-endian",
        "float-sparse", "shape-rank", "data-length", "negative-shape", "negative-sparse-id",
        "sparse-id-beyond-int32", "nan-prior", "rows-disagree", "infinite-dense",
        "negative-id", "unsigned-ids", "too-many-candidates"])
def test_malformed_msgpack_body_is_refused_naming_the_field(
        mutate: Callable[[dict[str, Any]], None], named: str) -> None:
    body = _body()
    mutate(body)
    with pytest.raises(ContractError) as err:
        decode_columnar_request(msgspec.msgpack.encode(body))
    assert str(err.value).startswith("RankRequest: ")
    assert named in str(err.value)


def test_bodies_that_are_not_msgpack_or_too_large_are_refused_before_columns() -> None:
    valid = encode_columnar_request(_request())
    for payload, named in ((b"\xc1", "malformed msgpack"), (valid[:-5], "malformed msgpack"),
                           (b'{"request_id": "r1"}', "looks like JSON; declare it as "
                                                     "application/json"),
                           (msgspec.msgpack.encode([1, 2]), "Expected `object`, got `array`")):
        with pytest.raises(ContractError, match="RankRequest: ") as err:
            decode_columnar_request(payload)
        assert named in str(err.value)
    with pytest.raises(ContractError, match="exceeds the 100-byte limit"):
        decode_columnar_request(valid, max_bytes=100)


def test_candidates_of_different_sparse_widths_are_refused_naming_the_first_odd_one() -> None:
    request = _request(n=4)
    ragged = msgspec.structs.replace(request, candidates=[
        *request.candidates[:2], Candidate(id=9, sparse=[1]), *request.candidates[3:]])
    with pytest.raises(ContractError, match=r"`\$\.candidates\[2\]\.sparse` has 1 ids but "
                                            r"`\$\.candidates\[0\]\.sparse` has 3"):
        encode_columnar_request(ragged)


@pytest.mark.parametrize(("candidate", "named"), [
    (Candidate(id=1, sparse=[1, 2, "3"]), "`$.candidates[1].sparse` holds '3'"),  # type: ignore[list-item]
    (Candidate(id=1, sparse=[1, 2, 1.5]), "`$.candidates[1].sparse` holds 1.5"),  # type: ignore[list-item]
    (Candidate(id=2**64, sparse=[1, 2, 3]), "`$.candidates[1].id` holds 18446744073709551616"),
    (Candidate(id=1, sparse=[1, 2, 3], prior="0.5"), "`$.candidates[1].prior` holds '0.5'"),  # type: ignore[arg-type]
])
def test_values_no_column_carries_are_refused_by_the_encoder_naming_them(
        candidate: Candidate, named: str) -> None:
    request = _request(n=3)
    bad = msgspec.structs.replace(request, candidates=[request.candidates[0], candidate,
                                                       request.candidates[2]])
    with pytest.raises(ContractError) as err:
        encode_columnar_request(bad)
    assert named in str(err.value)


def test_sparse_ids_beyond_the_contract_travel_for_the_worker_to_refuse_by_index() -> None:
    request = _request(n=3)
    wide = msgspec.structs.replace(request, candidates=[
        *request.candidates[:2], Candidate(id=3, sparse=[1, 2**40, 3])])
    with pytest.raises(ContractError, match=r"`\$\.sparse\[2\]\[1\]` is 1099511627776"):
        decode_columnar_request(encode_columnar_request(wide))


@pytest.mark.parametrize(("content_type", "encoding"), [
    (None, "json"), ("", "json"), ("application/json", "json"),
    ("Application/JSON; charset=utf-8", "json"),
    ("application/x-www-form-urlencoded", "json"),      # what `curl -d` declares
    ("application/msgpack", "msgpack"), ("application/x-msgpack", "msgpack"),
    ("application/vnd.msgpack", "msgpack"),
    ("text/plain", None), ("application/octet-stream", None), ("application/msgpackx", None),
    ("multipart/form-data; boundary=x", None),
])
def test_a_body_is_read_in_the_encoding_its_content_type_declares(
        content_type: str | None, encoding: str | None) -> None:
    assert request_encoding(content_type) == encoding


@pytest.mark.parametrize(("accept", "encoding"), [
    (None, "json"), ("", "json"), ("*/*", "json"), ("application/*", "json"),
    ("application/json", "json"), ("text/html,application/xhtml+xml;q=0.9", "json"),
    ("application/msgpack", "msgpack"), ("application/vnd.msgpack", "msgpack"),
    (ACCEPT_MSGPACK, "msgpack"), ("application/json, application/msgpack", "msgpack"),
    ("application/json, application/msgpack;q=0.5", "json"),
    ("application/msgpack;q=0", "json"), ("application/msgpack;q=high", "json"),
    ("application/msgpack;q=0.2, */*;q=0.1", "msgpack"),
    (";;;,,q=", "json"),
])
def test_the_answer_is_msgpack_only_when_accept_ranks_it_at_least_as_high_as_json(
        accept: str | None, encoding: str) -> None:
    assert response_encoding(accept) == encoding


def _response() -> RankResponse:
    return RankResponse(request_id="r1", model="powerful", scores=[0.3, 0.1], scored=2,
                        optional_scored=1, optional_shed=3, shed_reason="overload",
                        server=ServerState(queue_delay_ms=1.5, in_flight=4, shedding_level=1))


def test_a_response_is_read_in_the_encoding_its_content_type_declares() -> None:
    for encoding, content_type in (("msgpack", "application/msgpack"),
                                   ("json", "application/json; charset=utf-8"), ("json", None)):
        body = encode_rank_response(_response(), encoding)  # type: ignore[arg-type]
        assert decode_rank_response(body, content_type) == _response()
    with pytest.raises(ContractError, match="RankResponse: Expected `object`, got `int`"):
        decode_rank_response(encode(_response()), "application/msgpack")
    with pytest.raises(ContractError, match="content type 'text/html' is neither"):
        decode_rank_response(b"<html>", "text/html")


def test_a_msgpack_response_is_checked_as_strictly_as_json() -> None:
    short = msgspec.structs.replace(_response(), scored=3)
    with pytest.raises(ContractError, match=r"`\$\.scored` is 3 but 2 scores"):
        decode_rank_response(encode_rank_response(short, "msgpack"), "application/msgpack")


def test_either_encoding_decodes_to_what_a_worker_scores() -> None:
    request = _request()
    as_json = decode_rank_request(encode(request), "json")
    as_msgpack = decode_rank_request(encode_columnar_request(request), "msgpack")
    assert as_json == request
    assert isinstance(as_msgpack, ColumnarRequest) and as_msgpack.to_request() == request


def test_both_encodings_give_the_model_the_same_arrays() -> None:
    request = _request(n=6, width=3)
    from_json = model_inputs(request, 4, 3, "baseline")
    columns = decode_columnar_request(encode_columnar_request(request))
    from_msgpack = model_inputs(columns, 4, 3, "baseline")
    for a, b in zip(from_json, from_msgpack, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert from_msgpack[0].dtype == np.float32 and from_msgpack[1].dtype == np.int64


@pytest.mark.parametrize(("num_dense", "num_sparse", "named"), [
    (5, 3, "`$.dense` has 4 values; the baseline model takes 5"),
    (4, 2, "ids per candidate; the baseline model takes 2"),
])
def test_a_request_the_model_cannot_take_is_refused_naming_the_field(
        num_dense: int, num_sparse: int, named: str) -> None:
    columns = decode_columnar_request(encode_columnar_request(_request()))
    with pytest.raises(ShapeMismatch, match=re.escape(named)):
        model_inputs(columns, num_dense, num_sparse, "baseline")
