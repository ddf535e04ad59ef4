"""The ranking endpoint's body shapes decode strictly and name the field that is wrong."""

from __future__ import annotations

import json

import msgspec
import pytest

from schemas.codec import ContractError
from workers.api import (
    MAX_CANDIDATES,
    Candidate,
    RankRequest,
    RankResponse,
    ServerState,
    decode_request,
    decode_response,
    encode,
)


def _request(**overrides: object) -> dict[str, object]:
    body: dict[str, object] = {"request_id": "r1", "segment": "new-users", "value": 1.5,
                  "deadline_ms": 50, "dense": [0.1, 0.2],
                  "candidates": [{"id": 1, "sparse": [3, 4], "prior": 0.5},
                                 {"id": 2, "sparse": [], "prior": 0.1}],
                  "base_count": 1}
    body.update(overrides)
    return body


def test_request_round_trips_and_splits_baseline_from_optional() -> None:
    request = RankRequest(request_id="r1", segment="s", value=2.0, deadline_ms=20.0,
                          dense=[1.0], candidates=[Candidate(id=i) for i in range(5)],
                          base_count=3)
    decoded = decode_request(encode(request))
    assert decoded == request
    assert decoded.optional_count == 2


def test_request_decodes_plain_json_with_integer_deadline() -> None:
    request = decode_request(json.dumps(_request()).encode())
    assert request.deadline_ms == 50.0 and request.candidates[0].sparse == [3, 4]


@pytest.mark.parametrize(("override", "field"), [
    ({"value": -1.0}, "$.value"),
    ({"deadline_ms": 0}, "$.deadline_ms"),
    ({"segment": ""}, "$.segment"),
    ({"base_count": "1"}, "$.base_count"),
    ({"candidates": [{"id": -1}]}, "$.candidates[0].id"),
    ({"candidates": [{"id": 1, "extra": 1}]}, "extra"),
    ({"candidates": [{"id": i} for i in range(MAX_CANDIDATES + 1)]}, "$.candidates"),
    ({"base_count": 3}, "$.base_count"),
    ({"v": 2}, "$.v"),
])
def test_bad_request_names_the_field(override: dict[str, object], field: str) -> None:
    with pytest.raises(ContractError) as err:
        decode_request(json.dumps(_request(**override)).encode())
    assert field in str(err.value)
    assert str(err.value).startswith("RankRequest: ")


def test_malformed_and_oversized_requests_are_contract_errors() -> None:
    with pytest.raises(ContractError, match="malformed JSON"):
        decode_request(b"{not json")
    with pytest.raises(ContractError, match="exceeds"):
        decode_request(json.dumps(_request()).encode(), max_bytes=10)


def _response() -> RankResponse:
    return RankResponse(request_id="r1", model="powerful", scores=[0.3, 0.1], scored=2,
                        optional_scored=1, optional_shed=3, shed_reason="overload",
                        server=ServerState(queue_delay_ms=1.5, in_flight=4, shedding_level=1))


def test_response_round_trips() -> None:
    assert decode_response(encode(_response())) == _response()


def test_response_with_score_count_mismatch_is_refused() -> None:
    body = json.loads(encode(_response()))
    body["scored"] = 3
    with pytest.raises(ContractError, match=r"\$\.scored"):
        decode_response(json.dumps(body).encode())


def test_response_with_out_of_range_shedding_level_names_it() -> None:
    body = json.loads(encode(_response()))
    body["server"]["shedding_level"] = 4
    with pytest.raises(ContractError, match=r"\$\.server\.shedding_level"):
        decode_response(json.dumps(body).encode())


def test_room_is_left_out_of_a_response_unless_set_so_an_older_client_reads_it() -> None:
    plain = json.loads(encode(_response()))["server"]
    assert "optional_room" not in plain and "preempted" not in plain
    with_room = msgspec.structs.replace(_response(), server=ServerState(
        queue_delay_ms=0.0, in_flight=0, shedding_level=0, optional_room=12))
    assert decode_response(encode(with_room)).server.optional_room == 12


def test_a_request_asks_for_room_only_when_it_says_so() -> None:
    assert decode_request(json.dumps(_request()).encode()).report_room is False
    asked = decode_request(json.dumps(_request(report_room=True)).encode())
    assert asked.report_room is True
