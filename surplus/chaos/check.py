"""The checker: invariants judged over a whole chaos history (``surplus.chaos.history``).

Pure: a `History` in, `Violation`s out. Each invariant is one function, and each violation
names the shortest stretch of the history that shows it (``t0``..``t1``, seconds of the run)
and the faults in force then, so that ``surplus chaos --seed N`` replays it.

- ``baseline_served``: every request was served (a request always carries baseline work;
  invariant 1 of DESIGN.md: losing optional capacity, or any single fault the fleet is built
  for, never loses a baseline request).
- ``sla``: in every window of ``window_s`` with no fault on the baseline path (a baseline
  replica killed, frozen, restarting or behind a slow or cut network, or a broker killed or
  paused on the run's one host, and ``settle_s`` after it; and the fleet's start-up, the first
  ``startup_s``, whose brokers take the baseline replicas' cores as a restarted one does), the
  baseline p99 is within the SLA. The start-up's p99 is reported (`summary`), not judged.
- ``reclaim``: no request started after a replica's reclaim deadline (or after the notice
  reached it, when it came late) was served by that replica with optional work, until the
  pool was granted again (invariant 3).
- ``targets_ttl``: no optional work was decided on targets older than their TTL, read on the
  run's clock with ``ttl_slack_ms`` for the receiver's estimate of its offset to the control
  plane (the run and the control plane keep true clocks; clock jumps go to workers)
  (invariant 2).
- ``targets_epoch``: targets applied by the client, and held by each worker, never went to an
  older epoch (a duplicate or a reordered, replayed target applied).
- ``targets_flow``: the client never went longer than ``max_targets_gap_s`` without a new
  target, from the first to the end of the run: every fault heals, and the control plane
  comes back from each (a process that is up but never ticks is a crash too).
- ``notices_kept``: every notice the broker acknowledged is on the preemption topic at the
  end (acks=all on a three-node cluster: no acknowledged write is lost).
- ``labels_counted``: every label delivered is counted by the control plane's join, under
  some reason (joined, late, orphan, duplicate), summed over its processes (invariants 4 and
  5: a restart loses at most a window of joins, whose labels count as orphans), except those
  a killed process took in after its last report (``labels_at_risk``: a known gap, see
  docs/reliability.md).
- ``forged_refused``: every forged message was dead-lettered as refused (``unsigned``,
  ``unknown_key``, ``bad_signature``), and no forged target was applied (invariant 6).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgspec

from surplus.chaos.history import FaultRecord, History, Request

#: Dead-letter reasons that say a message was refused for its signature.
REFUSALS = ("unsigned", "unknown_key", "bad_signature")
#: Join reasons a label is counted under.
LABEL_REASONS = ("joined", "late", "orphan", "duplicate")
#: Windows with fewer served requests are too thin for a p99.
MIN_WINDOW_SAMPLES = 20
#: Forged targets carry epochs from here up, far above any genuine one.
FORGED_EPOCH = 1_000_000_000


class Violation(msgspec.Struct, frozen=True):
    """One broken invariant: what, and the stretch of the run that shows it."""

    invariant: str
    t0: float
    t1: float
    what: str
    #: The faults in force in [t0, t1] (kind:target).
    faults: list[str] = []


def _faults_in(history: History, t0: float, t1: float) -> list[str]:
    return [f"{f.kind}:{f.target}@{f.t:.1f}-{f.end_t:.1f}" for f in history.faults
            if f.t <= t1 and f.end_t >= t0]


def _violation(history: History, invariant: str, t0: float, t1: float,
               what: str) -> Violation:
    return Violation(invariant, round(t0, 3), round(t1, 3), what,
                     _faults_in(history, t0, t1))


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    rank = max(0, math.ceil(0.99 * len(ordered)) - 1)
    return ordered[rank]


def baseline_served(history: History) -> list[Violation]:
    return [_violation(history, "baseline_served", r.t, r.end_t,
                       f"request {r.request_id} failed: {r.error}")
            for r in history.requests if not r.served]


def _baseline_faulted(history: History) -> list[FaultRecord]:
    return [f for f in history.faults if f.baseline_path]


def sla(history: History) -> list[Violation]:
    run = history.run
    if not history.requests:
        return []
    faulted = [(f.t, f.end_t + run.settle_s) for f in _baseline_faulted(history)]
    if run.startup_s > 0:
        faulted.append((0.0, run.startup_s))
    last = max(r.t for r in history.requests)
    out = []
    for k in range(int(last // run.window_s) + 1):
        t0, t1 = k * run.window_s, (k + 1) * run.window_s
        if any(a < t1 and b > t0 for a, b in faulted):
            continue
        latencies = [r.latency_ms for r in history.requests if t0 <= r.t < t1 and r.served]
        if len(latencies) < MIN_WINDOW_SAMPLES:
            continue
        p99 = _p99(latencies)
        if p99 > run.sla_p99_ms:
            out.append(_violation(history, "sla", t0, t1,
                                  f"baseline p99 {p99:.0f} ms > SLA {run.sla_p99_ms:.0f} ms "
                                  f"over {len(latencies)} requests"))
    return out


def startup(history: History) -> dict[str, Any]:
    """The start-up the SLA invariant does not judge: its length and the p99 of the requests
    served in it (None when it has none), so that what it left out is still seen."""
    run = history.run
    latencies = [r.latency_ms for r in history.requests if r.t < run.startup_s and r.served]
    return {"seconds": run.startup_s,
            "baseline_p99_ms": round(_p99(latencies), 1) if latencies else None}


def reclaim(history: History) -> list[Violation]:
    out = []
    for notice in history.notices:
        if not (notice.reclaims_replica and notice.acked):
            continue
        reached = notice.direct_t if notice.direct_t is not None else notice.acked_t
        start = max(notice.deadline_t, reached if reached is not None else notice.t)
        regrants = [g.t for g in history.grants if g.pool == notice.pool and g.t > notice.t]
        end = min(regrants) if regrants else math.inf
        served = [r for r in history.requests
                  if start < r.t < end and r.served and r.model == "powerful"]
        if served:
            first = served[0]
            out.append(_violation(
                history, "reclaim", notice.deadline_t, first.end_t,
                f"{len(served)} requests served by the powerful replica after notice "
                f"{notice.notice_id} (deadline {notice.deadline_t:.2f}, reached "
                f"{start:.2f}); first {first.request_id} at {first.t:.2f}"))
    return out


def _optional(r: Request) -> bool:
    return r.served and not r.baseline_only and (r.extra > 0 or r.routed == "powerful")


def targets_ttl(history: History) -> list[Violation]:
    run = history.run
    out = []
    for r in history.requests:
        if not _optional(r):
            continue
        age = r.wall_ms - r.issued_at_ms
        if age > r.ttl_ms + run.ttl_slack_ms:
            out.append(_violation(history, "targets_ttl", r.t - age / 1000.0, r.t,
                                  f"request {r.request_id} did optional work on targets "
                                  f"epoch {r.epoch} {age} ms old (TTL {r.ttl_ms} ms)"))
    return out


def targets_epoch(history: History) -> list[Violation]:
    out = []
    held, held_t = -1, 0.0
    for offer in history.offers:
        if not offer.accepted:
            continue
        if offer.epoch <= held:
            out.append(_violation(history, "targets_epoch", held_t, offer.t,
                                  f"client applied epoch {offer.epoch} after {held}"))
        held, held_t = max(held, offer.epoch), offer.t
    last: dict[str, tuple[int, float]] = {}
    for sample in sorted(history.worker_epochs, key=lambda s: s.t):
        if sample.epoch <= 0:
            continue  # a worker (re)starting, before its first target
        before, before_t = last.get(sample.worker, (-1, 0.0))
        if sample.epoch < before:
            out.append(_violation(history, "targets_epoch", before_t, sample.t,
                                  f"worker {sample.worker} went from epoch {before} to "
                                  f"{sample.epoch}"))
        last[sample.worker] = (max(before, sample.epoch), sample.t)
    return out


def targets_flow(history: History) -> list[Violation]:
    run = history.run
    applied = sorted(o.t for o in history.offers if o.accepted)
    if not applied:
        return [_violation(history, "targets_flow", 0.0, run.duration_s,
                           "the client applied no target at all")]
    out = []
    for a, b in zip(applied, [*applied[1:], run.duration_s], strict=True):
        if b - a > run.max_targets_gap_s:
            out.append(_violation(history, "targets_flow", a, b,
                                  f"no new target for {b - a:.1f} s"))
    return out


def notices_kept(history: History) -> list[Violation]:
    on_topic = history.read_back.get("preemption")
    acked = [n for n in history.notices if n.acked]
    if on_topic is None:
        if not acked:
            return []
        return [_violation(history, "notices_kept", 0.0, acked[-1].t,
                           "the preemption topic was not read back")]
    return [_violation(history, "notices_kept", n.t, n.acked_t or n.t,
                       f"acknowledged notice {n.notice_id} is not on the topic")
            for n in acked if n.notice_id not in on_topic]


def counted_labels(history: History) -> dict[str, int]:
    """Labels the join counted, by reason, over the whole run: each control-plane process's
    last counts, summed. A process's counts start from 0 and only grow; the processes are
    told apart by the control plane's kills in the history (a new one starts after each),
    not by the counts, since a new process may count more orphans at once than the one
    before it did in all."""
    restarts = sorted(f.t for f in history.faults if f.kind == "control_kill" and f.ok)
    last: dict[int, dict[str, int]] = {}
    for estimate in history.estimates:
        process = sum(1 for t in restarts if t <= estimate.t)
        seen = last.setdefault(process, {})
        for reason in LABEL_REASONS:
            seen[reason] = max(seen.get(reason, 0), estimate.join.get(reason, 0))
    return {reason: sum(counts.get(reason, 0) for counts in last.values())
            for reason in LABEL_REASONS}


def labels_at_risk(history: History) -> int:
    """Labels sent while a control-plane process that was then killed had taken in labels
    it had not yet reported: from a second before the last LiftReport preceding each kill
    to the kill. Their counts die with the process (they are not part of its restored
    state), and the labels are not read again once their offsets were committed."""
    if history.labels is None:
        return 0
    kills = sorted(f.t for f in history.faults if f.kind == "control_kill" and f.ok)
    reports = sorted(e.t for e in history.estimates)
    windows = []
    for kill in kills:
        before = [t for t in reports if t <= kill]
        windows.append(((before[-1] if before else 0.0) - 1.0, kill))
    return sum(1 for t in history.labels.times if any(a <= t <= b for a, b in windows))


def labels_counted(history: History) -> list[Violation]:
    labels = history.labels
    if labels is None:
        return [_violation(history, "labels_counted", 0.0, history.run.duration_s,
                           "no label totals recorded")]
    by_reason = counted_labels(history)
    uncounted = labels.delivered - sum(by_reason.values())
    at_risk = labels_at_risk(history)
    if uncounted > at_risk:
        return [_violation(history, "labels_counted", 0.0, history.run.duration_s,
                           f"{uncounted} of {labels.delivered} labels delivered are counted "
                           f"by no reason, {at_risk} of them sent just before a control plane "
                           f"was killed (counted: {by_reason}, over "
                           f"{len(history.estimates)} lift reports)")]
    return []


def forged_refused(history: History) -> list[Violation]:
    refused = {d.digest for d in history.dead_letters
               if any(reason in d.reason for reason in REFUSALS)}
    out = [_violation(history, "forged_refused", f.t, f.t,
                      f"forged {f.topic} ({f.how}) {f.digest[:12]} was not dead-lettered "
                      f"as refused")
           for f in history.forged if f.acked and f.digest not in refused]
    out += [_violation(history, "forged_refused", o.t, o.t,
                       f"client applied forged targets epoch {o.epoch}")
            for o in history.offers if o.accepted and o.epoch >= FORGED_EPOCH]
    out += [_violation(history, "forged_refused", s.t, s.t,
                       f"worker {s.worker} holds forged targets epoch {s.epoch}")
            for s in history.worker_epochs if s.epoch >= FORGED_EPOCH]
    return out


INVARIANTS: dict[str, Callable[[History], list[Violation]]] = {
    "baseline_served": baseline_served, "sla": sla, "reclaim": reclaim,
    "targets_ttl": targets_ttl, "targets_epoch": targets_epoch,
    "targets_flow": targets_flow, "notices_kept": notices_kept, "labels_counted": labels_counted,
    "forged_refused": forged_refused}


def check(history: History) -> list[Violation]:
    """Every invariant's violations, invariant by invariant, each by time."""
    out: list[Violation] = []
    for judge in INVARIANTS.values():
        out += sorted(judge(history), key=lambda v: v.t0)
    return out


def summary(history: History, violations: list[Violation]) -> dict[str, Any]:
    """What a run prints and writes: faults injected by kind (those that could not be
    injected apart), violations by invariant, and each violation."""
    injected: dict[str, int] = {}
    failed: dict[str, int] = {}
    for fault in history.faults:
        table = injected if fault.ok else failed
        table[fault.kind] = table.get(fault.kind, 0) + 1
    by_invariant = dict.fromkeys(INVARIANTS, 0)
    for v in violations:
        by_invariant[v.invariant] += 1
    served = sum(r.served for r in history.requests)
    return {"seed": history.run.seed, "duration_s": history.run.duration_s,
            "requests": len(history.requests), "served": served,
            "served_powerful": sum(r.model == "powerful" for r in history.requests),
            "optional_scored": sum(r.optional_scored for r in history.requests),
            "faults": dict(sorted(injected.items())),
            "faults_not_injected": dict(sorted(failed.items())),
            "notices": len(history.notices), "forged": len(history.forged),
            "labels": {"delivered": history.labels.delivered if history.labels else 0,
                       "counted": counted_labels(history),
                       "at_risk_of_a_kill": labels_at_risk(history)},
            "startup": startup(history),
            "violations": by_invariant,
            "violation_list": [msgspec.to_builtins(v) for v in violations]}
