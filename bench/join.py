"""Benchmark: the decision/label join, against a raw decode-and-dict-lookup loop.

A scope's decisions (one client batch message per 500) are fed first, then one label message
per decision, in a shuffled order, plus 5% labels for unknown ids. The join is the real one:
each label's bytes are decoded by the contract's codec, go through the rulebook
(``streams.control.dispatch``: key check, the scope's controller) into
``ScopeController.on_label``, whose join pairs it and folds the joined decision into the
off-policy estimates. The reference loop decodes the same bytes and looks the request id up
in a plain dict, which no join can avoid. Both run in this process on the same messages,
interleaved, best of ``repeat``; the Kafka consumer in front of either is not included (the
ingest benchmark measures that per message: ~13k/s one message at a time through Faust, so
labels at these rates must be consumed in batches too).

    python -m bench.join [labels]      # prints one JSON line

Target: >= 50,000 labels/s.
"""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from schemas.codec import decode, decode_outcomes, encode, encode_outcomes
from schemas.contract import DECISION_VERSION, OutcomeLabel, RoutingOutcome
from streams.control.config import ControlConfig
from streams.control.controller import ScopeController
from streams.control.dispatch import RULES, dispatch, dispatch_all

TARGET_LABELS_PER_S = 50_000
SCOPE = "eu1"


def _messages(n: int, seed: int) -> tuple[list[bytes], list[tuple[str, bytes]]]:
    rng = random.Random(seed)
    decisions = [RoutingOutcome(
        v=DECISION_VERSION, ts_ms=1_700_000_000_000 + i, scope=SCOPE, request_id=f"{SCOPE}-{i}",
        segment=f"s{i % 8}", model="powerful" if rng.random() < 0.3 else "baseline",
        propensity=0.3, extra=16, holdout=rng.random() < 0.01) for i in range(n)]
    batches = [encode_outcomes(decisions[i:i + 500]) for i in range(0, n, 500)]
    labels = [(f"{SCOPE}-{i}", encode(OutcomeLabel(
        ts_ms=1_700_000_060_000 + i, scope=SCOPE, request_id=f"{SCOPE}-{i}",
        value=rng.gauss(1.0, 0.5)))) for i in range(n)]
    labels += [(f"x{i}", encode(OutcomeLabel(ts_ms=1_700_000_060_000, scope=SCOPE,
                                            request_id=f"x{i}", value=1.0)))
               for i in range(n // 20)]
    rng.shuffle(labels)
    return batches, labels


def _join(batches: list[bytes], labels: list[tuple[str, bytes]]) -> tuple[float, int]:
    controller = ScopeController(SCOPE, ControlConfig())
    controllers = {SCOPE: controller}.__getitem__
    outcomes, rule = RULES["outcomes"], RULES["labels"]
    now = 1_700_000_100_000
    for batch in batches:
        dispatch_all(outcomes, SCOPE, decode_outcomes(batch), controllers, now)
    started = time.perf_counter()
    for key, value in labels:
        dispatch(rule, key, decode(OutcomeLabel, value), controllers, now)
    return time.perf_counter() - started, controller.join.counts["joined"]


def _reference(batches: list[bytes], labels: list[tuple[str, bytes]]) -> tuple[float, int]:
    pending: dict[str, RoutingOutcome] = {}
    for batch in batches:
        for d in decode_outcomes(batch):
            pending[d.request_id] = d
    started = time.perf_counter()
    found = 0
    for _key, value in labels:
        label = decode(OutcomeLabel, value)
        if pending.get(label.request_id) is not None:
            found += 1
    return time.perf_counter() - started, found


def run(labels: int = 200_000, repeat: int = 3, seed: int = 1) -> dict[str, Any]:
    batches, messages = _messages(labels, seed)
    best_join = best_ref = float("inf")
    joined = found = 0
    for _ in range(repeat):
        t, joined = _join(batches, messages)
        best_join = min(best_join, t)
        t, found = _reference(batches, messages)
        best_ref = min(best_ref, t)
    rate = len(messages) / best_join
    return {"labels": len(messages), "joined": joined, "reference_found": found,
            "labels_per_s": round(rate), "reference_per_s": round(len(messages) / best_ref),
            "ratio_to_reference": round(best_ref / best_join, 3),
            "target_labels_per_s": TARGET_LABELS_PER_S,
            "meets_target": rate >= TARGET_LABELS_PER_S and joined == found}


if __name__ == "__main__":
    print(json.dumps(run(*(int(a) for a in sys.argv[1:2]))))
