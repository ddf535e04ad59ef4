"""The preemption notices a worker makes and the ones it checks before acting on them.

A notice only stops optional work, but a forged one could stop it on every replica at once, so
with signatures on a notice must carry its issuer's signature, and one posted straight to the
replica (``POST /v1/preempt``) must come in a request whose own headers sign its body within
``notice_request_window_s``: a recorded request replayed later is refused. A replica stopping
on SIGTERM makes a notice for itself alone, signed as any other, so its own stop takes the
same path as a reclaim.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

from schemas.contract import PreemptionNotice
from schemas.signing import KeySource
from workers.runtime.config import WorkerConfig

#: How a preemption notice reached the worker.
NoticePath = Literal["kafka", "http"]


def shutdown_notice(config: WorkerConfig, notice_id: str, now_ms: int,
                    keys: KeySource | None) -> PreemptionNotice:
    """A notice for this replica alone whose deadline is the shutdown grace period, signed
    when signatures are on."""
    notice = PreemptionNotice(
        notice_id=notice_id, ts_ms=now_ms, region=config.region,
        pool_id=config.pool, replicas=[config.worker_id],
        deadline_ms=now_ms + int(config.shutdown_grace_s * 1000),
        accelerator=config.accelerator, accelerator_units=config.accelerator_units)
    if keys is not None:
        notice = keys.sign(notice)
    return notice


def notice_refusal(keys: KeySource | None, notice: PreemptionNotice, path: NoticePath,
                   headers: Mapping[str, str] | None, body: bytes,
                   clock_ms: Callable[[], int], window_ms: int) -> str | None:
    """Why a notice must not be acted on for its signature; None when signatures are off or
    it verifies.

    :param headers: by ``http``, the request's headers, which must sign ``body``.
    :param clock_ms: the wall clock the request's signing time is judged by (read only then).
    :param window_ms: how old a signed request may be (``notice_request_window_s``).
    """
    if keys is None:
        return None
    refusal = None
    if path == "http":
        refusal = keys.ring.check_request(headers or {}, body, clock_ms(), window_ms)
    if refusal is None:
        refusal = keys.check(notice)
    return refusal
