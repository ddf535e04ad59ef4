"""HMAC signatures cover the whole target, survive the wire, and need the key."""

from __future__ import annotations

import msgspec
import pytest

from schemas.codec import decode, encode
from schemas.contract import ControlTargets
from schemas.signing import canonical_bytes, sign, signature_of, verifier
from tests.unit.policy.helpers import targets


def test_signature_ignores_segment_order_and_the_signature_field() -> None:
    a = targets(segments={"x": (0.1, 0.1), "y": (0.2, 0.1)})
    b = targets(segments={"y": (0.2, 0.1), "x": (0.1, 0.1)})
    assert canonical_bytes(a) == canonical_bytes(b)
    signed = sign(a, b"k")
    assert canonical_bytes(signed) == canonical_bytes(
        msgspec.structs.replace(signed, signature=None))


def test_every_field_is_covered() -> None:
    base = targets()
    changed = [msgspec.structs.replace(base, epoch=2),
               msgspec.structs.replace(base, ttl_ms=1),
               msgspec.structs.replace(base, scope="us1"),
               msgspec.structs.replace(base, reason="manual"),
               targets(extra=65), targets(coverage=0.26)]
    sigs = {signature_of(t, b"k") for t in [base, *changed]}
    assert len(sigs) == len(changed) + 1


def test_verifier_accepts_own_signature_after_round_trip_and_rejects_others() -> None:
    signed = decode(ControlTargets, encode(sign(targets(), "k1")))
    assert verifier("k1")(signed) is None
    assert verifier("k2")(signed) == "bad_signature"
    assert verifier("k1")(targets()) == "unsigned"


def test_empty_key_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        verifier(b"")
