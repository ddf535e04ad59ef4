"""Issuers' signatures on control messages, and the keyring that checks them.

Four messages steer the fleet: ControlTargets (the control plane), PreemptionNotice (the
scheduler, a capacity agent, a worker on SIGTERM), CapacityEvent (the scheduler, a capacity
agent) and OperatorOverride (`surplus override`). Anyone who can write their topics could shed
every optional unit or grant capacity that does not exist, so with a key configured each is
signed by its issuer and refused by its receivers unless it verifies. One module signs and
checks them all; it sits in `schemas`, the layer every side imports, and is the one import path
for signing.

**What is signed.** HMAC-SHA256 over the message's canonical bytes: JSON with every object's
keys sorted and the signature field cleared, so a message decoded and re-encoded on its way (a
target's segments in another order) verifies against what its issuer computed. The ``key_id``
the message carries is covered too.

**The keyring.** Several keys are accepted at once, each named by a key id; one of them signs
(`Keyring.signing_id`). A message names its key, so a receiver checks one HMAC, and a rotation
needs no flag day: add the new key everywhere, switch signing to it, retire the old key once
nothing signed with it is still in flight (docs/security.md). A keyring comes from one key file
(its key is named ``default``) or a key directory: one file per key, named by its id, and an
``active`` file naming the signing key (`load_keyring`). Targets signed before key ids carry
none; they are checked against every key held, so they still verify after an upgrade.

**The direct notice path.** ``POST /v1/preempt`` carries the notice in its body and, in three
headers, the key id, the time of sending and an HMAC over both (`Keyring.sign_request`). The
receiver refuses a request whose time is outside its window, so a recorded request cannot be
replayed later (`Keyring.check_request`; the clock is the caller's).

Refusals are short stable reasons, the label receivers count them under: ``unsigned``,
``unknown_key``, ``bad_signature`` and, on the direct path, ``stale_request``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

import msgspec
from msgspec import UNSET

from schemas.contract import (
    SIGNED_VERSION,
    CapacityEvent,
    ControlTargets,
    OperatorOverride,
    PreemptionNotice,
)

SignedEvent = ControlTargets | PreemptionNotice | CapacityEvent | OperatorOverride
S = TypeVar("S", bound=SignedEvent)

UNSIGNED = "unsigned"
UNKNOWN_KEY = "unknown_key"
BAD_SIGNATURE = "bad_signature"
STALE_REQUEST = "stale_request"
#: Every reason a message is refused for its signature: what receivers count and dead-letter.
REFUSALS = frozenset({UNSIGNED, UNKNOWN_KEY, BAD_SIGNATURE, STALE_REQUEST})

#: The id of a key given as one file (no directory to name it).
DEFAULT_KEY_ID = "default"
#: The file of a key directory that names the signing key; never a key itself.
ACTIVE_FILE = "active"
#: Headers of a signed ``POST /v1/preempt``.
KEY_ID_HEADER = "X-Surplus-Key-Id"
TIMESTAMP_HEADER = "X-Surplus-Timestamp"
SIGNATURE_HEADER = "X-Surplus-Signature"

_KEY_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_canonical = msgspec.json.Encoder(order="sorted")


def canonical_bytes(event: SignedEvent) -> bytes:
    """The bytes a signature covers: the message without its signature, keys sorted."""
    cleared = None if isinstance(event, ControlTargets) else UNSET
    return _canonical.encode(msgspec.structs.replace(event, signature=cleared))


def _key_bytes(key: bytes | str) -> bytes:
    if isinstance(key, str):
        key = key.encode()
    if not key:
        raise ValueError("signing key must not be empty")
    return key


def signature_of(event: SignedEvent, key: bytes | str) -> str:
    """Hex HMAC-SHA256 of the canonical bytes of ``event`` under ``key``."""
    return hmac.new(_key_bytes(key), canonical_bytes(event), hashlib.sha256).hexdigest()


def _same(given: str, expected: str) -> bool:
    # Bytes, not str: compare_digest refuses non-ASCII str, and a forged value may be any.
    return hmac.compare_digest(given.encode(), expected.encode())


class Keyring:
    """Keys accepted at once, by id, and the one that signs. Immutable: a reload builds a new
    ring (`KeySource`), so a check never sees half a rotation.

    :param keys: key id -> secret bytes; ids are file names (``[A-Za-z0-9._-]``, at most 64).
    :param signing_id: the id of the key new messages are signed with; must be in ``keys``.
    """

    __slots__ = ("_keys", "signing_id")

    def __init__(self, keys: Mapping[str, bytes | str], signing_id: str) -> None:
        if not keys:
            raise ValueError("a keyring needs at least one key")
        for key_id in keys:
            if not _KEY_ID.match(key_id):
                raise ValueError(f"key id {key_id!r}: use letters, digits, '.', '_' or '-' "
                                 "(at most 64)")
        if signing_id not in keys:
            raise ValueError(f"signing key {signing_id!r} is not in the keyring "
                             f"({', '.join(sorted(keys))})")
        self._keys = MappingProxyType({k: _key_bytes(v) for k, v in keys.items()})
        self.signing_id = signing_id

    @classmethod
    def of(cls, key: Keyring | bytes | str) -> Keyring:
        """A ring from a ring, or from one bare key (named ``default``)."""
        return key if isinstance(key, Keyring) else cls({DEFAULT_KEY_ID: key}, DEFAULT_KEY_ID)

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The ids held, sorted (what logs and readiness show; never the keys)."""
        return tuple(sorted(self._keys))

    def sign(self, event: S) -> S:
        """A copy of ``event`` signed with the signing key: v8 or later, naming the key."""
        named = msgspec.structs.replace(event, v=max(event.v, SIGNED_VERSION),
                                        key_id=self.signing_id)
        return msgspec.structs.replace(
            named, signature=signature_of(named, self._keys[self.signing_id]))

    def check(self, event: SignedEvent) -> str | None:
        """Why ``event`` must be refused (``unsigned``, ``unknown_key``, ``bad_signature``),
        or None when a key of this ring signed it. Constant-time in the signature."""
        signature = event.signature
        if not isinstance(signature, str):
            return UNSIGNED
        key_id = event.key_id
        if key_id is UNSET:  # signed before key ids: the one key of its day is one of these
            ok = any(_same(signature, signature_of(event, key)) for key in self._keys.values())
            return None if ok else BAD_SIGNATURE
        key = self._keys.get(str(key_id))
        if key is None:
            return UNKNOWN_KEY
        return None if _same(signature, signature_of(event, key)) else BAD_SIGNATURE

    def same_as(self, other: Keyring) -> bool:
        """The same keys under the same ids, signing with the same one."""
        return self.signing_id == other.signing_id and dict(self._keys) == dict(other._keys)

    def sign_request(self, body: bytes, ts_ms: int) -> dict[str, str]:
        """Headers that authenticate a ``POST /v1/preempt`` of ``body`` sent at ``ts_ms``."""
        key = self._keys[self.signing_id]
        return {KEY_ID_HEADER: self.signing_id, TIMESTAMP_HEADER: str(ts_ms),
                SIGNATURE_HEADER: _request_mac(key, ts_ms, body)}

    def check_request(self, headers: Mapping[str, str], body: bytes, now_ms: int,
                      window_ms: int) -> str | None:
        """Why a signed request must be refused, or None: its headers name a key of this ring,
        its HMAC covers this body and time, and that time is within ``window_ms`` of
        ``now_ms`` either way (``stale_request`` otherwise: a replay, or a clock far off)."""
        key_id = headers.get(KEY_ID_HEADER)
        sent = headers.get(TIMESTAMP_HEADER)
        signature = headers.get(SIGNATURE_HEADER)
        if key_id is None or sent is None or signature is None:
            return UNSIGNED
        key = self._keys.get(key_id)
        if key is None:
            return UNKNOWN_KEY
        if not sent.isascii() or not sent.isdigit() or len(sent) > 16:
            return BAD_SIGNATURE
        ts_ms = int(sent)
        if not _same(signature, _request_mac(key, ts_ms, body)):
            return BAD_SIGNATURE
        if abs(now_ms - ts_ms) > window_ms:
            return STALE_REQUEST
        return None

    def __repr__(self) -> str:  # never the keys
        return f"Keyring(key_ids={list(self.key_ids)}, signing_id={self.signing_id!r})"


def _request_mac(key: bytes, ts_ms: int, body: bytes) -> str:
    return hmac.new(key, b"surplus-notice\n%d\n" % ts_ms + body, hashlib.sha256).hexdigest()


def sign(event: S, key: Keyring | bytes | str) -> S:
    """A copy of ``event`` signed with ``key`` (a ring's signing key; a bare key is
    ``default``)."""
    return Keyring.of(key).sign(event)


def verifier(key: Keyring | bytes | str) -> Callable[[SignedEvent], str | None]:
    """A check for receivers (`TargetState`): the refusal reason, or None for a message
    signed with a key of ``key``."""
    return Keyring.of(key).check


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


def load_keyring(path: str | Path) -> Keyring:
    """The keyring at ``path``: one key file (id ``default``), or a key directory.

    In a directory every regular file whose name is a key id is a key (dotfiles are skipped: a
    Kubernetes Secret mounted as a volume keeps its bookkeeping in them); ``active`` holds the
    id of the signing key and may be left out where the directory holds one key.

    Raises ValueError naming the file or directory when the ring cannot be built.
    """
    path = Path(path)
    if not path.is_dir():
        return Keyring({DEFAULT_KEY_ID: load_key(path)}, DEFAULT_KEY_ID)
    try:
        entries = sorted(p for p in path.iterdir() if not p.name.startswith("."))
    except OSError as exc:
        raise ValueError(f"cannot read signing key directory {path}: {exc.strerror}") from None
    keys: dict[str, bytes] = {}
    for entry in entries:
        if entry.name == ACTIVE_FILE or not entry.is_file():
            continue
        if not _KEY_ID.match(entry.name):
            raise ValueError(f"signing key file {entry}: its name is the key id; use letters, "
                             "digits, '.', '_' or '-' (at most 64)")
        keys[entry.name] = load_key(entry)
    if not keys:
        raise ValueError(f"signing key directory {path} holds no key")
    active = path / ACTIVE_FILE
    if active.is_file():
        signing_id = load_key(active).decode(errors="replace")
        if signing_id not in keys:
            raise ValueError(f"{active} names key {signing_id!r}, which {path} does not hold "
                             f"(it holds {', '.join(sorted(keys))})")
    elif len(keys) == 1:
        signing_id = next(iter(keys))
    else:
        raise ValueError(f"signing key directory {path} holds {len(keys)} keys "
                         f"({', '.join(sorted(keys))}) and no `{ACTIVE_FILE}` file naming the "
                         "one that signs")
    return Keyring(keys, signing_id)


class KeySource:
    """The keyring a process holds now, re-read from its path on `reload` (a key directory an
    operator rotates while the system runs). Thread-safe by reference swap: ``ring`` is
    always a whole ring, the old one or the new.

    :param path: a key file or key directory (`load_keyring`); read once here, so a bad one
        stops the process at start naming it.
    """

    def __init__(self, path: str | Path) -> None:
        self.path: Path | None = Path(path)
        self.ring = load_keyring(self.path)

    @classmethod
    def fixed(cls, ring: Keyring) -> KeySource:
        """A source that holds ``ring`` for good (a key given inline, not as a file)."""
        source = cls.__new__(cls)
        source.path = None
        source.ring = ring
        return source

    def reload(self) -> bool:
        """Re-read the path; True when the ring changed. A ring that cannot be built raises
        ValueError (naming the file) and the ring held stays in use."""
        if self.path is None:
            return False
        ring = load_keyring(self.path)
        if ring.same_as(self.ring):
            return False
        self.ring = ring
        return True

    def sign(self, event: S) -> S:
        """``event`` signed with the current ring's signing key."""
        return self.ring.sign(event)

    def check(self, event: SignedEvent) -> str | None:
        """`Keyring.check` with the current ring."""
        return self.ring.check(event)
