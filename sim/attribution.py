"""Outcome labels on their way, and the truth the simulator keeps to judge the control plane's
measurement by.

A request's label reaches the control plane and the client after a delay (some never, some
twice: ``[labels]``); until then it waits on a queue ordered by ``(due ms, sequence)``. When a
label the control plane joins (within its window) carries the truth of its request, that truth
is counted (``add_truth``) so the summary can set the true lift (``true_lift``) next to the
measured one. Each surplus target's learned segment order is recorded against the true gain
order, so the summary can say when it settled.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator
from typing import Any

import msgspec

from schemas.contract import AnswerUse, ControlTargets
from sim.controllers import SurplusPlane


class Truth(msgspec.Struct, frozen=True):
    """What the simulator knows of a treated request: was it served by the powerful model,
    its incremental value (the powerful model's gain, the extras' value and what a precompute
    answer added over them), the inverse of the propensity its decision record logs, and
    what became of the precompute answer it held (None: none)."""

    powerful: bool
    value: float
    weight: float
    answer: AnswerUse | None = None


class PendingLabel(msgspec.Struct, frozen=True):
    """A label on its way: the request it is for, its observed value, and when its decision
    was published; ``truth`` is None for a holdout request or a label's second copy."""

    region: str
    request_id: str
    value: float
    segment: str
    model: str
    decided_ms: int
    truth: Truth | None


class LabelQueue:
    """Labels by the time they are due, then by the order they were sent."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, PendingLabel]] = []
        self._seq = itertools.count()

    def send(self, due_ms: float, label: PendingLabel) -> None:
        heapq.heappush(self._heap, (due_ms, next(self._seq), label))

    def due_by(self, end: float) -> Iterator[tuple[float, PendingLabel]]:
        """(when due, label) of each label due by ``end``, in order."""
        heap = self._heap
        while heap and heap[0][0] <= end:
            due, _, label = heapq.heappop(heap)
            yield due, label


class Attribution:
    """Per region, the truth of the treated requests whose labels the control plane joins,
    and the history of its learned segment order."""

    def __init__(self, t0: int) -> None:
        self.t0 = t0
        #: Per region and segment: ``add_truth``'s sums.
        self.truth: dict[str, dict[str, list[float]]] = {}
        #: Per region: (ts, labels joined) of each surplus target, and if its segment order
        #: matched the true gain order.
        self.order: dict[str, list[tuple[int, int, bool]]] = {}

    def joined(self, label: PendingLabel) -> None:
        """The control plane joins ``label``: count its truth, if it has one."""
        truth = label.truth
        if truth is not None:
            add_truth(self.truth.setdefault(label.region, {}), label.segment,
                      truth.powerful, truth.value, truth.weight, truth.answer)

    def track_order(self, targets: ControlTargets, true_gain: dict[str, float],
                    joined: int) -> None:
        """Does the targets' segment order (by posterior gain) match the true gain order?"""
        learned = targets.sbm.segments
        match = len(true_gain) > 1 and set(true_gain) <= set(learned) and same_order(
            true_gain, {name: learned[name].gain_mean for name in true_gain})
        self.order.setdefault(targets.scope, []).append((targets.issued_at_ms, joined, match))

    def summary(self, plane: SurplusPlane, regions: list[str]) -> dict[str, Any]:
        """Measured lift (the control plane's, against the holdout) next to the true lift of
        the treated requests, the join's counts, and when the learned segment order settled
        on the true one."""
        lift: dict[str, Any] = {}
        labels: dict[str, Any] = {}
        order: dict[str, Any] = {}
        for region in sorted(regions):
            controller = plane.driver.controllers.get(region)
            if controller is None:
                continue
            true = true_lift(self.truth.get(region, {}))
            measured = controller.estimates.lift()
            levers = ("all", "sbm", "rma") + (("precompute",) if "precompute" in measured
                                               else ())
            lift[region] = {lever: {
                "lift_measured": _r(measured[lever].measured),
                "lift_ci_low": _r(measured[lever].ci_low),
                "lift_ci_high": _r(measured[lever].ci_high),
                "lift_true": _r(true[lever])} for lever in levers}
            lift[region]["counts"] = controller.estimates.counts()
            counts = controller.join.counts
            labels[region] = {"labels_joined": counts["joined"], "labels_late": counts["late"],
                              "labels_orphan": counts["orphan"],
                              "labels_duplicate": counts["duplicate"],
                              "decisions_unlabelled": counts["unlabelled"],
                              "decisions_evicted": counts["evicted"],
                              "decisions_pending": len(controller.join)}
            history = self.order.get(region, [])
            settled = None
            for i in range(len(history)):
                if all(m for _, _, m in history[i:]):
                    settled = history[i]
                    break
            powerful = sum(a.powerful.n for a in controller.estimates.state.segments.values())
            order[region] = (
                {"settled_at_s": None, "labels_joined": None,
                 "why": "no powerful-model labels: no SBM traffic to learn an order from"}
                if powerful == 0 else
                {"settled_at_s": None, "labels_joined": None,
                 "why": "the order had not settled on the true one by the end"}
                if settled is None else
                {"settled_at_s": round((settled[0] - self.t0) / 1000.0, 3),
                 "labels_joined": settled[1]})
        return {"lift": lift, "labels": labels, "segment_order": order}


def add_truth(truth: dict[str, list[float]], segment: str, powerful: bool, value: float,
              weight: float, answer: AnswerUse | None = None) -> None:
    """Count one treated request's true incremental value (its gain from the powerful model
    plus the value of the extras it got) into its segment's sums ``[baseline-arm n, Σ value,
    powerful n, Σ value, baseline Σw, Σw·value, powerful Σw, Σw·value, answer used n,
    Σ value, answer withheld n, Σ value]``, ``weight`` being the inverse of the propensity
    its decision record logs."""
    sums = truth.setdefault(segment, [0.0] * 12)
    arm = 2 if powerful else 0
    sums[arm] += 1.0
    sums[arm + 1] += value
    sums[4 + arm] += weight
    sums[5 + arm] += weight * value
    if answer is not None:
        at = 8 if answer == "used" else 10
        sums[at] += 1.0
        sums[at + 1] += value


def true_lift(truth: dict[str, list[float]]) -> dict[str, float | None]:
    """The true lift per treated request, per lever, from ``add_truth``'s sums. ``all``: the
    incremental value of the treated requests. ``sbm``: per segment, what routing to the
    powerful model added (the powerful arm's incremental value less the baseline arm's, each
    weighted by the inverse propensity, as the off-policy estimate weighs them: the arms
    are compared as if every request had been routed at random, so a time when one arm was
    rarer, such as a reclaim that sends all to baseline with extras cut, does not count as
    that arm's worth), times its powerful requests; ``precompute``: per segment, what the
    requests that used an answer got over those whose answer was withheld (both true
    values, noise-free), times the requests that used one (as `streams.control.answer_lift`
    compares them); ``rma``: the rest. The measured split estimates the same quantities."""
    n = sum(t[0] + t[2] for t in truth.values())
    if n <= 0:
        return {"all": None, "sbm": None, "rma": None, "precompute": None}
    total = sum(t[1] + t[3] for t in truth.values())
    sbm = pre = 0.0
    for name in sorted(truth):
        _, _, npow, _, wb, wvb, wp, wvp, nu, vu, nw, vw = truth[name]
        if npow:
            sbm += npow * (wvp / wp - (wvb / wb if wb else 0.0))
        if nu and nw:
            pre += nu * (vu / nu - vw / nw)
    return {"all": total / n, "sbm": sbm / n, "rma": (total - sbm - pre) / n,
            "precompute": pre / n}


def same_order(true: dict[str, float], learned: dict[str, float]) -> bool:
    """Same ranking of segments by gain (ties in the truth may come in either order)."""
    names = sorted(true)
    return all((true[a] - true[b]) * (learned[a] - learned[b]) > 0 or true[a] == true[b]
               for i, a in enumerate(names) for b in names[i + 1:])


def normal_from(u1: float, u2: float) -> float:
    """A standard normal from two uniforms (Box-Muller)."""
    return math.sqrt(-2.0 * math.log(max(u1, 1e-300))) * math.cos(2.0 * math.pi * u2)


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
