"""Forged messages: each kind of event the fleet must refuse, unsigned, signed with a key no
receiver holds (``unknown_key``), or naming the fleet's signing key with the wrong secret
(``bad_signature``).

A forged target claims an epoch past every genuine one (`surplus.chaos.check.FORGED_EPOCH`
and up), so one that a receiver accepted stands out in the history; a forgery is known again
on the dead-letter topic by its digest.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import Callable

from schemas.clock import wall_ms
from schemas.codec import decode
from schemas.contract import (
    CapacityEvent,
    ControlTargets,
    Event,
    OperatorOverride,
    PreemptionNotice,
)
from schemas.signing import Keyring
from surplus.chaos.check import FORGED_EPOCH
from surplus.chaos.errors import ChaosError
from surplus.fleet.procs import POWERFUL_POOL, REGION, RMA_POOL


def digest(value: bytes) -> str:
    """How a forged message is known again on the dead-letter topic."""
    return hashlib.sha256(value).hexdigest()


def forged(topic: str, how: str, rng: random.Random, keyring: Keyring,
           genuine_targets: Callable[[], list[bytes]]) -> Event:
    """A forged event for ``topic``, signed as ``how`` says.

    :param topic: ``preemption``, ``capacity``, ``overrides`` or ``targets``.
    :param how: ``unsigned``, ``unknown_key`` or ``bad_signature``.
    :param rng: the fault's own random draws (a forged target's epoch).
    :param keyring: the fleet's keyring: a bad signature claims its signing key id.
    :param genuine_targets: the genuine targets seen so far, the newest last; a forged target
        copies the newest one's levers, so only its signature and epoch are wrong.
    """
    now = wall_ms()
    event: Event
    if topic == "preemption":
        event = PreemptionNotice(notice_id=f"forged-{now}", ts_ms=now, region=REGION,
                                 pool_id=POWERFUL_POOL, deadline_ms=now,
                                 accelerator="a100", accelerator_units=8.0)
    elif topic == "capacity":
        event = CapacityEvent(event_id=f"forged-{now}", ts_ms=now, region=REGION,
                              pool_id=RMA_POOL, kind="grant", accelerator="a100",
                              accelerator_units=64.0, cpu_units=512.0,
                              expires_at_ms=now + 600_000)
    elif topic == "overrides":
        event = OperatorOverride(scope=REGION, issued_at_ms=now, ttl_ms=600_000,
                                 reason="forged by the nemesis", kill=True)
    else:
        genuine = genuine_targets()
        if not genuine:
            raise ChaosError("no genuine targets to forge from yet")
        model = decode(ControlTargets, genuine[-1])
        event = ControlTargets(scope=REGION, epoch=FORGED_EPOCH + rng.randrange(10**6),
                               issued_at_ms=now, ttl_ms=model.ttl_ms, rma=model.rma,
                               sbm=model.sbm)
    if how == "unknown_key":
        return Keyring({"forger": secrets.token_hex(32)}, "forger").sign(event)
    if how == "bad_signature":
        signer = keyring.signing_id
        return Keyring({signer: secrets.token_hex(32)}, signer).sign(event)
    return event
