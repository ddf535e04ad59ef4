"""The end of a demo run: its processes stopped in dependency order, with short waits once a
second Ctrl-C asks for haste.

The order is the run's dependencies read backwards. The scheduler stops before the workers,
so what it lent is revoked while they still answer; the workers' /metrics (their preemption
reaction histograms, kept with those of replicas already taken back) are read before they
stop; the control plane stops after them, and the recorder last of the Kafka clients, so it
reads the last revokes and reports; the broker goes after every client.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.kafka_clients import KafkaException
from schemas.kafka_config import KafkaSettings
from surplus import localkafka
from surplus.demo import precompute_audit, report
from surplus.demo.children import Children
from surplus.demo.replicas import ReplicaBook


def stop_after_load(children: Children, book: ReplicaBook, workers: list[str], *,
                    scrape: Callable[[str], str | None], endpoints: list[str], out: Path,
                    quick: Callable[[], bool], say: Callable[[str], None]) -> None:
    """Everything but the load (stopped first, by the run) and the broker, in order.

    :param children: the run's processes by name.
    :param book: the opportunistic replicas' lives and CPU slices (sampled once more, then
        closed).
    :param workers: the run's worker ids (those of ``children`` that exist are stopped).
    :param scrape: a worker's /metrics text by worker id, None when it does not answer.
    :param endpoints: the worker ids that have a metrics port (those scraped).
    :param out: the run's output folder (``worker_metrics.json``).
    :param quick: true once the waits should be short.
    :param say: where what is left behind is reported.
    """
    children.stop_one("scheduler", signal.SIGTERM, 5 if quick() else 20)
    book.pending = []
    with contextlib.suppress(OSError):
        book.sample(force=True)
    scrape_workers(children, book, endpoints, scrape, out)
    for name in workers:
        if name in children:
            children[name].send(signal.SIGTERM)
    for name in workers:
        children.stop_one(name, signal.SIGTERM, 5 if quick() else 30)
    left = book.close()
    if left:
        say(f"warning: CPU slices not removed (still in use?): {', '.join(left)}")
    children.stop_one("control-plane", signal.SIGTERM, 5 if quick() else 30)
    if "recorder" in children and not quick():
        time.sleep(1.5)  # let the recorder read the last revokes and reports
    children.stop_one("recorder", signal.SIGINT, 5 if quick() else 30)
    children.stop_one("prometheus", signal.SIGTERM, 10)


def scrape_workers(children: Children, book: ReplicaBook, names: list[str],
                   scrape: Callable[[str], str | None], out: Path) -> None:
    """Each running worker's /metrics text into ``worker_metrics.json``, with those the book
    kept of replicas already taken back: the report's preemption reaction histogram."""
    texts = dict(book.scraped)
    for name in names:
        child = children.get(name)
        text = scrape(name) if child is not None and child.alive() else None
        if text is not None:
            texts[name] = text
    if texts:
        (out / "worker_metrics.json").write_text(json.dumps(texts))


def audit_precompute(kafka: KafkaSettings, region: str, models: list[str], out: Path,
                     run_ms: int, say: Callable[[str], None]) -> None:
    """Every precompute job checked against the answers and the groups' commits
    (`precompute_audit`), once the workers have stopped and before the broker goes."""
    try:
        metrics = json.loads((out / "worker_metrics.json").read_text())
    except (OSError, ValueError):
        metrics = {}
    try:
        result = precompute_audit.audit(kafka, region, models, now_ms=wall_ms(), run_ms=run_ms,
                                        worker_metrics=metrics)
    except (KafkaException, TimeoutError, kafka_clients.TopicUnavailable) as exc:
        result = {"checked": False, "why": f"{type(exc).__name__}: {exc}"}
    (out / report.PRECOMPUTE_AUDIT).write_text(json.dumps(result, indent=2) + "\n")
    if result.get("checked") and result.get("jobs_lost"):
        say(f"warning: precompute jobs lost: {result['jobs_lost']} (see "
            f"{report.PRECOMPUTE_AUDIT})")


def stop_broker(broker_dir: Path, out: Path, say: Callable[[str], None]) -> None:
    """The embedded broker, and its GC pauses kept for the report (see ``BROKER_GC_LOG``)."""
    localkafka.down(broker_dir)
    say("kafka: embedded broker stopped")
    with contextlib.suppress(OSError):
        shutil.copyfile(broker_dir / localkafka.GC_LOG, out / report.BROKER_GC_LOG)
