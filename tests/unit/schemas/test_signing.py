"""The generic signing module: every control message signed by its issuer, checked by a
keyring of several keys named in the message, and the direct path's request signature."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from schemas.codec import ContractError, decode, encode
from schemas.contract import (
    SIGNED_VERSION,
    CapacityEvent,
    ControlTargets,
    OperatorOverride,
    PreemptionNotice,
)
from schemas.signing import (
    ACTIVE_FILE,
    KEY_ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Keyring,
    KeySource,
    SignedEvent,
    load_keyring,
    sign,
    signature_of,
)
from tests.unit.policy.helpers import targets

T0 = 1_700_000_000_000
OLD = Keyring({"k1": b"old-secret"}, "k1")
BOTH = Keyring({"k1": b"old-secret", "k2": b"new-secret"}, "k2")


def _notice() -> PreemptionNotice:
    return PreemptionNotice(notice_id="n1", ts_ms=T0, region="eu1", pool_id="eu1/p",
                            replicas=["w1"], deadline_ms=T0 + 30_000)


def _capacity() -> CapacityEvent:
    return CapacityEvent(event_id="g1", ts_ms=T0, region="eu1", pool_id="eu1/p", kind="grant",
                         accelerator="a100", accelerator_units=8.0, expires_at_ms=T0 + 60_000)


def _override() -> OperatorOverride:
    return OperatorOverride(scope="eu1", issued_at_ms=T0, ttl_ms=60_000, reason="incident",
                            kill=True)


MESSAGES: dict[str, Callable[[], SignedEvent]] = {
    "targets": targets, "notice": _notice, "capacity": _capacity, "override": _override}


def _tampered(event: SignedEvent) -> SignedEvent:
    """The same message with one field an attacker cares about changed."""
    if isinstance(event, ControlTargets):
        return msgspec.structs.replace(event, rma=msgspec.structs.replace(
            event.rma, extra_candidates=event.rma.extra_candidates + 100))
    if isinstance(event, PreemptionNotice):
        return msgspec.structs.replace(event, replicas=[])   # the whole pool, not one replica
    if isinstance(event, CapacityEvent):
        return msgspec.structs.replace(event, accelerator_units=800.0)
    return msgspec.structs.replace(event, kill=False, max_extra=0)


@pytest.mark.parametrize("kind", sorted(MESSAGES))
def test_a_signed_message_verifies_after_crossing_the_wire_as_v8_naming_its_key(
        kind: str) -> None:
    event = MESSAGES[kind]()
    signed = OLD.sign(event)
    wire = decode(type(event), encode(signed))
    assert (wire.v, wire.key_id) == (SIGNED_VERSION, "k1")
    assert OLD.check(wire) is None and BOTH.check(wire) is None


@pytest.mark.parametrize("kind", sorted(MESSAGES))
@pytest.mark.parametrize("forgery, reason", [
    ("no signature", "unsigned"), ("wrong key", "bad_signature"),
    ("unknown key id", "unknown_key"), ("tampered body", "bad_signature"),
    ("swapped key id", "bad_signature")])
def test_every_forgery_of_every_message_is_refused_by_its_reason(
        kind: str, forgery: str, reason: str) -> None:
    event = MESSAGES[kind]()
    forged = {
        "no signature": lambda: event,
        "wrong key": lambda: Keyring({"k1": b"attacker"}, "k1").sign(event),
        "unknown key id": lambda: Keyring({"k9": b"old-secret"}, "k9").sign(event),
        "tampered body": lambda: _tampered(OLD.sign(event)),
        # A valid signature under k1, relabelled as k2's: the key id is covered too.
        "swapped key id": lambda: msgspec.structs.replace(OLD.sign(event), key_id="k2"),
    }[forgery]()
    wire = decode(type(event), encode(forged))
    assert BOTH.check(wire) == reason


def test_unsigned_messages_are_written_exactly_as_before_signing_existed() -> None:
    for make in MESSAGES.values():
        event = make()
        doc = msgspec.json.decode(encode(event))
        assert "key_id" not in doc and doc["v"] < SIGNED_VERSION
        assert "signature" not in doc or doc["signature"] is None   # targets always had one


def test_a_key_id_under_an_older_version_is_refused_on_decode() -> None:
    doc = msgspec.json.decode(encode(OLD.sign(_notice())))
    doc["v"] = 7
    with pytest.raises(ContractError, match="key_id"):
        decode(PreemptionNotice, msgspec.json.encode(doc))


def test_targets_signed_before_key_ids_verify_against_any_key_held() -> None:
    legacy = msgspec.structs.replace(targets(), signature=signature_of(targets(), b"old-secret"))
    assert legacy.key_id is msgspec.UNSET
    assert BOTH.check(legacy) is None
    assert Keyring({"k2": b"new-secret"}, "k2").check(legacy) == "bad_signature"


def test_a_bare_key_is_the_default_entry_of_a_ring() -> None:
    signed = sign(_notice(), b"s3cret")
    assert signed.key_id == "default"
    assert Keyring({"default": b"s3cret"}, "default").check(signed) is None


def test_a_ring_must_hold_its_signing_key_and_never_shows_the_keys() -> None:
    with pytest.raises(ValueError, match="'k3' is not in the keyring"):
        Keyring({"k1": b"a"}, "k3")
    with pytest.raises(ValueError, match="key id"):
        Keyring({"a/b": b"a"}, "a/b")
    assert "old-secret" not in repr(BOTH) and "k2" in repr(BOTH)


def test_a_request_signature_covers_body_and_time_within_its_window() -> None:
    body = encode(OLD.sign(_notice()))
    headers = OLD.sign_request(body, T0)
    assert BOTH.check_request(headers, body, T0 + 29_000, 30_000) is None
    assert BOTH.check_request(headers, body, T0 + 31_000, 30_000) == "stale_request"
    assert BOTH.check_request(headers, body, T0 - 31_000, 30_000) == "stale_request"
    assert BOTH.check_request(headers, body + b" ", T0, 30_000) == "bad_signature"
    moved = {**headers, TIMESTAMP_HEADER: str(T0 + 60_000)}  # a replay re-dated
    assert BOTH.check_request(moved, body, T0 + 60_000, 30_000) == "bad_signature"
    assert BOTH.check_request({**headers, KEY_ID_HEADER: "k9"}, body, T0, 30_000) \
        == "unknown_key"
    assert BOTH.check_request({KEY_ID_HEADER: "k1"}, body, T0, 30_000) == "unsigned"
    assert BOTH.check_request({**headers, TIMESTAMP_HEADER: "-1"}, body, T0, 30_000) \
        == "bad_signature"
    attacker = Keyring({"k1": b"attacker"}, "k1").sign_request(body, T0)
    assert BOTH.check_request(attacker, body, T0, 30_000) == "bad_signature"
    assert SIGNATURE_HEADER in headers


def test_a_key_directory_names_keys_by_file_and_the_signer_by_active(tmp_path: Path) -> None:
    (tmp_path / "k1").write_text("old-secret\n")
    (tmp_path / "k2").write_text("new-secret")
    (tmp_path / ACTIVE_FILE).write_text("k2\n")
    (tmp_path / "..data").mkdir()         # a Secret volume's bookkeeping is not a key
    (tmp_path / ".hidden").write_text("x")
    ring = load_keyring(tmp_path)
    assert (ring.key_ids, ring.signing_id) == (("k1", "k2"), "k2")
    assert ring.same_as(BOTH)


def test_a_single_key_file_is_the_default_key(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("s3cret")
    ring = load_keyring(tmp_path / "key")
    assert (ring.key_ids, ring.signing_id) == (("default",), "default")


@pytest.mark.parametrize("layout, message", [
    ({}, "holds no key"),
    ({"k1": "a", "k2": "b"}, "no `active` file"),
    ({"k1": "a", "active": "k2"}, "names key 'k2'"),
    ({"k1": ""}, "is empty"),
    ({"bad name!": "a"}, "its name is the key id"),
])
def test_a_broken_key_directory_is_refused_naming_the_file(
        tmp_path: Path, layout: dict[str, str], message: str) -> None:
    for name, text in layout.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        load_keyring(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_a_key_source_reloads_a_rotation_and_keeps_its_ring_on_a_broken_one(
        tmp_path: Path) -> None:
    (tmp_path / "k1").write_text("old-secret")
    source = KeySource(tmp_path)
    first = source.ring
    assert not source.reload()
    (tmp_path / "k2").write_text("new-secret")
    (tmp_path / ACTIVE_FILE).write_text("k1")
    assert source.reload() and source.ring.key_ids == ("k1", "k2")
    signed_old = source.sign(_notice())
    (tmp_path / ACTIVE_FILE).write_text("k2")
    assert source.reload() and source.sign(_notice()).key_id == "k2"
    assert source.check(signed_old) is None            # in flight while both are held
    (tmp_path / ACTIVE_FILE).write_text("k7")          # a typo mid-rotation
    with pytest.raises(ValueError, match="k7"):
        source.reload()
    assert source.ring.signing_id == "k2"              # the ring held stays in use
    (tmp_path / ACTIVE_FILE).write_text("k2")
    (tmp_path / "k1").unlink()
    assert source.reload() and source.check(signed_old) == "unknown_key"
    assert first.key_ids == ("k1",)                    # rings are never changed in place
