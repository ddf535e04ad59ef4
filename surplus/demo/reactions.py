"""The workers' preemption reactions, from the /metrics texts scraped at the end of a run:
notice-to-shed and delivery histograms summed over every worker, their quantiles the way
Prometheus' ``histogram_quantile`` interpolates within a bucket, and the notices per path.
Parsed with prometheus-client's own parser of the text format."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile`` over cumulative (upper bound, count) buckets."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return buckets[-1][0]


REACTION = "surplus_worker_preemption_reaction_seconds"
#: The part of the reaction that is Kafka's: notice stamped to notice read by the worker.
DELIVERY = "surplus_worker_preemption_delivery_seconds"
#: Notice stamped to the precompute lever stopped (the end of the slice in service, if any).
PRECOMPUTE_STOP = "surplus_worker_precompute_stop_seconds"


NOTICES = "surplus_worker_preemption_notices_total"


def labelled(metrics: dict[str, str], sample: str) -> Iterator[tuple[dict[str, str], float]]:
    """Every sample named ``sample`` in every worker's /metrics text: its labels and value
    (prometheus-client's own parser of the text format)."""
    for text in metrics.values():
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == sample:
                    yield s.labels, s.value


def notice_paths(metrics: dict[str, str]) -> dict[str, dict[str, int]]:
    """Notices the workers read, by path (``http``, ``kafka``) and outcome, summed over every
    worker's /metrics text: which copy came first (``applied``) and which second."""
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for labels, value in labelled(metrics, NOTICES):
        path, outcome = labels["path"], labels["outcome"]
        out[path][outcome] = out[path].get(outcome, 0) + round(value)
    return {path: dict(sorted(v.items())) for path, v in sorted(out.items())}


def reaction_mean_s(metrics: dict[str, str], histogram: str = REACTION) -> float | None:
    """Mean reaction over every worker (the histogram's _sum over its _count)."""
    total = sum(v for _, v in labelled(metrics, f"{histogram}_sum"))
    count = sum(v for _, v in labelled(metrics, f"{histogram}_count"))
    return total / count if count else None


def reaction_buckets(metrics: dict[str, str],
                     histogram: str = REACTION) -> list[tuple[float, float]]:
    """Summed cumulative buckets of a reaction histogram over every worker's /metrics text."""
    summed: dict[float, float] = defaultdict(float)
    for labels, value in labelled(metrics, f"{histogram}_bucket"):
        summed[float(labels["le"])] += value      # float("+Inf") is inf
    return sorted(summed.items())
