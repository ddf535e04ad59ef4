"""The contract's codecs: strict, versioned, bounded, and every error names what was wrong."""

from __future__ import annotations

import json

import msgspec
import pytest

from schemas.codec import (
    Codec,
    ContractError,
    decode,
    decode_telemetry,
    encode,
    encode_telemetry,
    from_builtins,
    to_builtins,
)
from schemas.contract import (
    ControlTargets,
    Event,
    RmaTarget,
    SbmTarget,
    WindowReport,
)
from schemas.events import EVENT_TYPES
from tests.unit.schemas.samples import SAMPLES


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_every_event_type_round_trips_through_json(event: Event) -> None:
    assert decode(type(event), encode(event)) == event
    assert from_builtins(type(event), to_builtins(event)) == event


def test_samples_cover_every_event_type() -> None:
    assert {type(e) for e in SAMPLES} == set(EVENT_TYPES)


def _report_json(**changes: object) -> bytes:
    sample = next(e for e in SAMPLES if isinstance(e, WindowReport))
    obj = to_builtins(sample)
    obj.update(changes)
    return json.dumps(obj).encode()


def test_wrong_type_names_the_field() -> None:
    with pytest.raises(ContractError, match=r"Expected `int`, got `str` - at `\$.requests`"):
        decode(WindowReport, _report_json(requests="12"))


def test_missing_field_names_the_field() -> None:
    payload = json.loads(_report_json())
    del payload["pool_id"]
    with pytest.raises(ContractError, match="missing required field `pool_id`"):
        decode(WindowReport, json.dumps(payload))


def test_unknown_field_is_rejected_by_name() -> None:
    with pytest.raises(ContractError, match="unknown field `surprise`"):
        decode(WindowReport, _report_json(surprise=1))


def test_unknown_schema_version_is_named_even_when_fields_changed() -> None:
    with pytest.raises(ContractError, match="unknown schema version 99"):
        decode(WindowReport, _report_json(v=99))
    with pytest.raises(ContractError, match="unknown schema version 99"):
        decode(WindowReport, b'{"v": 99, "something": "else"}')


def test_out_of_range_value_names_the_field() -> None:
    with pytest.raises(ContractError, match=r"\$.utilisation"):
        decode(WindowReport, _report_json(utilisation=-0.5))


def test_garbage_bytes_are_a_contract_error() -> None:
    for garbage in (b"\x00\xff\xfe", b"not json", b"", b"[1,2", b"null"):
        with pytest.raises(ContractError, match="WindowReport"):
            decode(WindowReport, garbage)


def test_oversized_payload_is_refused_before_parsing() -> None:
    codec = Codec(WindowReport, max_bytes=1000)
    with pytest.raises(ContractError, match="exceeds the 1000-byte limit"):
        codec.decode(b" " * 1001)


def test_deeply_nested_payload_is_rejected_without_recursion_error() -> None:
    nested = b'{"scope": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    with pytest.raises(ContractError):
        decode(ControlTargets, nested)


def test_targets_with_coverage_above_one_are_rejected() -> None:
    bad = ControlTargets(scope="s", epoch=1, issued_at_ms=1, ttl_ms=1000,
                         rma=RmaTarget(extra_candidates=1, budget_units_per_s=1.0),
                         sbm=SbmTarget(coverage=0.5))
    obj = to_builtins(bad)
    obj["sbm"]["coverage"] = 1.5
    with pytest.raises(ContractError, match=r"\$.sbm.coverage"):
        decode(ControlTargets, json.dumps(obj))


def test_telemetry_value_is_one_report_or_a_batch_checked_as_strictly() -> None:
    report = next(e for e in SAMPLES if isinstance(e, WindowReport))
    assert decode_telemetry(encode(report)) == [report]
    assert decode_telemetry(encode_telemetry([report, report])) == [report, report]
    with pytest.raises(ContractError, match=r"at `\$\[1\]`"):
        decode_telemetry(b"[" + encode(report) + b", 7]")
    bad_version = encode_telemetry([report]).replace(b'"v":2', b'"v":99')
    with pytest.raises(ContractError, match="unknown schema version 99"):
        decode_telemetry(bad_version)
    with pytest.raises(ContractError, match="malformed JSON"):
        decode_telemetry(b"[" + encode(report))


def test_a_v1_message_still_decodes_and_new_fields_take_their_defaults() -> None:
    payload = json.loads(_report_json(v=1))
    for field in ("busy_s", "units_done", "optional_requests_done"):
        payload.pop(field, None)
    report = decode(WindowReport, json.dumps(payload))
    assert (report.v, report.busy_s, report.units_done) == (1, 0.0, 0)


def test_targets_without_limits_encode_as_v1_readers_expect() -> None:
    from schemas.contract import RmaTarget, SbmTarget

    assert b"limited_by" not in msgspec.json.encode(RmaTarget(extra_candidates=1,
                                                              budget_units_per_s=2.0))
    assert b"limited_by" in msgspec.json.encode(SbmTarget(coverage=0.1, limited_by="sla"))


def test_a_target_without_a_cap_on_powerful_extras_encodes_as_a_v4_reader_expects() -> None:
    def sbm_json(sbm: SbmTarget) -> dict[str, object]:
        targets = ControlTargets(scope="eu1", epoch=1, issued_at_ms=0, ttl_ms=1_000,
                                 rma=RmaTarget(extra_candidates=8, budget_units_per_s=1.0),
                                 sbm=sbm)
        obj = json.loads(encode(targets))
        assert decode(ControlTargets, encode(targets)) == targets
        return obj["sbm"]

    assert "extra_candidates" not in sbm_json(SbmTarget(coverage=0.5))
    assert sbm_json(SbmTarget(coverage=0.5, extra_candidates=0))["extra_candidates"] == 0


def test_a_pool_wide_capacity_event_encodes_as_before_the_replica_field() -> None:
    from schemas.contract import CapacityEvent

    grant = CapacityEvent(event_id="c", ts_ms=1, region="eu1", pool_id="eu1/rank/baseline/a100/"
                          "opportunistic", kind="grant", accelerator="a100")
    obj = json.loads(encode(grant))
    assert obj["v"] == 2 and "replica" not in obj     # a v2-v6 reader reads it unchanged


def test_a_replica_grant_is_v7_and_an_older_version_naming_a_replica_is_refused() -> None:
    from schemas.contract import REPLICA_GRANT_VERSION, CapacityEvent

    fields = {"event_id": "c", "ts_ms": 1, "region": "eu1", "kind": "grant",
              "pool_id": "eu1/rank/baseline/a100/opportunistic", "accelerator": "a100"}
    grant = CapacityEvent(v=REPLICA_GRANT_VERSION, replica="w1", **fields)  # type: ignore[arg-type]
    assert decode(CapacityEvent, encode(grant)).replica == "w1"
    with pytest.raises(ContractError, match="`replica` is a v7 field"):
        decode(CapacityEvent, json.dumps({**fields, "v": 6, "replica": "w1"}))
