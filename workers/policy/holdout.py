"""The randomized holdouts: a fixed share of requests, picked by a hash of the request id, gets
no optional work whatever the targets say, so measured lift has a control group; and of the
visits that hold a fresh precompute answer, a share is ranked live without it, so the
precompute lever's lift has one too (among visits alike in having had an answer).

The hash (BLAKE2b of the id, its first 8 bytes as a fraction of 2**64) is the same on every
client, in the simulator and in replay: a request id is in the holdout or not, everywhere and
every time. It is independent of the segment and of the router's draws. The answer holdout
hashes the id with a salt of its own, so its draw is independent of the request holdout's.
"""

from __future__ import annotations

from hashlib import blake2b

from schemas.contract import AnswerUse

_SCALE = float(1 << 64)


def holdout_fraction_of(request_id: str) -> float:
    """Where ``request_id`` falls in [0, 1)."""
    digest = blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


def in_holdout(request_id: str, fraction: float) -> bool:
    """True for the ``fraction`` of request ids that get no optional work."""
    return fraction > 0.0 and holdout_fraction_of(request_id) < fraction


#: Prefixed to the request id for the answer holdout's hash.
_ANSWER_SALT = "answer/"


def withholds_answer(request_id: str, fraction: float) -> bool:
    """True for the ``fraction`` of request ids ranked live though they hold a fresh
    precompute answer: the precompute lever's control group."""
    return fraction > 0.0 and holdout_fraction_of(_ANSWER_SALT + request_id) < fraction


def answer_use(request_id: str, fraction: float) -> AnswerUse:
    """What a request holding a fresh precompute answer does with it: ``withheld`` for the
    answer holdout's ``fraction`` (ranked live instead), else ``used``. One rule for the
    client (`PrecomputeSide.answer`) and the simulator (`RegionPrecompute.visit`)."""
    return "withheld" if withholds_answer(request_id, fraction) else "used"
