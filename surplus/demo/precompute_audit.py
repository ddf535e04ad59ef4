"""Every precompute job a demo asked, checked against the answers and the groups' commits
once the workers have stopped (and committed what they answered) and before the broker goes.

A job is answered (its key and issue on the cache topic), still open (at or past its group's
committed offset: the next member reads it), or behind the commit unanswered. The commit
passes a job only once a worker answered it or read it after its expiry and skipped it, so a
job behind the commit that had not expired when the audit ran was lost outright (dropped at a
notice, say, and never read again). One that had expired may have been skipped: the workers
count their skips (``surplus_worker_precompute_jobs_total{outcome="expired"}``), and those the
count does not cover are lost too. A job answered twice (redelivered after a notice) is one
answer to the client, which keeps the latest per key; the audit counts the duplicates.

The answers are read back from the compacted cache topic, whose log is not cleaned before a
segment closes (``segment.ms``, ten minutes): a longer run may have lost superseded answers
to compaction, and the audit says it did not check.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from schemas import kafka_clients
from schemas.codec import ContractError, codec_for
from schemas.kafka_clients import OFFSET_BEGINNING, Consumer, TopicPartition
from schemas.kafka_config import KafkaSettings
from schemas.precompute import PrecomputeJob, PrecomputeResult, group_id
from surplus.demo.reactions import labelled

#: The cache topic's segments close after this long (`schemas.topics`): none is compacted
#: before then.
COMPACTION_FREE_MS = 600_000
TIMEOUT_S = 10.0
_jobs = codec_for(PrecomputeJob)
_answers = codec_for(PrecomputeResult)


def audit(kafka: KafkaSettings, region: str, models: Iterable[str], *, now_ms: int,
          run_ms: int, worker_metrics: Mapping[str, str]) -> dict[str, Any]:
    """The jobs of ``region`` checked (module docstring); ``run_ms``: how long the run was."""
    if run_ms >= COMPACTION_FREE_MS:
        return {"checked": False, "why": f"the run ({run_ms / 1000:.0f} s) may have outlived "
                f"the cache topic's first segment, and compaction its superseded answers"}
    jobs = [(p, o, job) for p, o, job in _read(kafka, "precompute", _jobs.decode)
            if job.scope == region]
    answers = Counter((a.job_key, a.issued_at_ms)
                      for _, _, a in _read(kafka, "cache", _answers.decode) if a.scope == region)
    commits = {model: _committed(kafka, group_id(kafka.prefix, region, model))
               for model in models}
    return classify(jobs, answers, commits, now_ms, _expired_skips(worker_metrics))


def classify(jobs: list[tuple[int, int, PrecomputeJob]], answers: Counter[tuple[str, int]],
             commits: Mapping[str, Mapping[int, int]], now_ms: int,
             expired_skips: int) -> dict[str, Any]:
    """The audit's arithmetic (pure): each job answered, open, or behind the commit."""
    answered = open_ = lost = expired_behind = 0
    for partition, offset, job in jobs:
        if answers[(job.job_key, job.issued_at_ms)]:
            answered += 1
        elif offset >= commits.get(job.model, {}).get(partition, 0):
            open_ += 1
        elif job.expires_at_ms > now_ms:
            lost += 1
        else:
            expired_behind += 1
    uncovered = max(0, expired_behind - expired_skips)
    return {"checked": True, "jobs_asked": len(jobs), "jobs_answered": answered,
            "jobs_open": open_, "jobs_expired_skipped": expired_behind - uncovered,
            "jobs_lost": lost + uncovered,
            "answers": sum(answers.values()),
            "answers_duplicate": sum(n - 1 for n in answers.values() if n > 1)}


def _read(kafka: KafkaSettings, name: str, decode: Any) -> list[tuple[int, int, Any]]:
    """Every message of a topic, decoded (one that does not decode is left out: it was
    dead-lettered where it was read)."""
    topic = kafka.topic(name)
    consumer = kafka_clients.consumer(kafka, f"{kafka.prefix}audit", **{
        "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        parts = kafka_clients.partitions(consumer, topic, TIMEOUT_S)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), TIMEOUT_S)[1]
                for p in parts}
        consumer.assign(kafka_clients.starting_at(topic, [p for p in parts if ends[p] > 0],
                                                  OFFSET_BEGINNING))
        return _drain(consumer, decode, {p for p in parts if ends[p] > 0})
    finally:
        consumer.close()


def _drain(consumer: Consumer, decode: Any, pending: set[int]) -> list[tuple[int, int, Any]]:
    out: list[tuple[int, int, Any]] = []
    while pending:
        msg = consumer.poll(TIMEOUT_S)
        if msg is None:
            raise TimeoutError(f"audit: no message in {TIMEOUT_S:.0f} s with partitions "
                               f"{sorted(pending)} still to read")
        if kafka_clients.is_partition_eof(msg.error()):
            pending.discard(msg.partition() or 0)
            continue
        if msg.error() is not None:
            continue
        with contextlib.suppress(ContractError):
            out.append((msg.partition() or 0, msg.offset() or 0, decode(msg.value() or b"")))
    return out


def _committed(kafka: KafkaSettings, group: str) -> dict[int, int]:
    """The group's committed offset per partition of the jobs topic (0: none yet)."""
    topic = kafka.topic("precompute")
    probe = kafka_clients.consumer(kafka, group, **{"enable.auto.commit": False})
    try:
        parts = kafka_clients.partitions(probe, topic, TIMEOUT_S)
        found = probe.committed([TopicPartition(topic, p) for p in parts], TIMEOUT_S)
        return {tp.partition: max(0, tp.offset) for tp in found}
    finally:
        probe.close()


def _expired_skips(worker_metrics: Mapping[str, str]) -> int:
    """Jobs the workers read after their expiry and skipped, summed over every worker."""
    return int(sum(value for labels, value in labelled(dict(worker_metrics),
                                                       "surplus_worker_precompute_jobs_total")
                   if labels.get("outcome") == "expired"))
