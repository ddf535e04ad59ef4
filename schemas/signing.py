"""Optional HMAC-SHA256 signatures on ControlTargets with a key shared by the control plane and
its receivers, so a receiver can refuse targets that nobody with the key issued.

It sits in `schemas` (the layer both sides import): the control plane signs with `sign`, workers
and clients check with `verifier`. It is the one import path for signing.

The signature covers the canonical bytes of the targets with `signature=None`: JSON with every
object's keys sorted, so a target that crossed Kafka (and was decoded and re-encoded, possibly
with its segments in another order) verifies against the signature its issuer computed.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from pathlib import Path

import msgspec

from schemas.contract import ControlTargets

_canonical = msgspec.json.Encoder(order="sorted")


def canonical_bytes(targets: ControlTargets) -> bytes:
    """The bytes a signature covers: the targets without their signature, keys sorted."""
    return _canonical.encode(msgspec.structs.replace(targets, signature=None))


def _key_bytes(key: bytes | str) -> bytes:
    if isinstance(key, str):
        key = key.encode()
    if not key:
        raise ValueError("signing key must not be empty")
    return key


def signature_of(targets: ControlTargets, key: bytes | str) -> str:
    """Hex HMAC-SHA256 of the canonical bytes of `targets`."""
    return hmac.new(_key_bytes(key), canonical_bytes(targets), hashlib.sha256).hexdigest()


def load_key(path: str | Path) -> bytes:
    """A signing key from a file (surrounding whitespace dropped): keeps it out of argv and env.

    Raises ValueError naming the file when it cannot be read or holds no key.
    """
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise ValueError(f"cannot read signing key file {path}: {exc.strerror}") from None
    if not key:
        raise ValueError(f"signing key file {path} is empty")
    return key


def sign(targets: ControlTargets, key: bytes | str) -> ControlTargets:
    """A copy of `targets` carrying its signature under `key`."""
    return msgspec.structs.replace(targets, signature=signature_of(targets, key))


def verifier(key: bytes | str) -> Callable[[ControlTargets], bool]:
    """A check for `TargetState`: True only for targets signed with `key` (constant-time)."""
    key = _key_bytes(key)

    def verify(targets: ControlTargets) -> bool:
        if targets.signature is None:
            return False
        # Bytes, not str: compare_digest refuses non-ASCII str, and a forged value may be any.
        return hmac.compare_digest(targets.signature.encode(),
                                   signature_of(targets, key).encode())

    return verify
