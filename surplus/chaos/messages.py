"""What the nemesis publishes, and its faults made of messages: a storm of genuine notices
reclaiming the opportunistic pools (on Kafka and, for the powerful pool, straight to its
replica) then re-granted, genuine targets and notices sent again (duplicated) or newest
first (reordered), and forgeries (`surplus.chaos.forgery`).

Every notice, grant and forgery is recorded with the load time of the broker's ack, so the
checker can tell a message the fleet never received from one it mishandled. A fault's own
random draws (a storm's notices, a forged target's epoch) come from a stream seeded by the
run's seed and the fault's time and kind, so a failure replays from its seed.
"""

from __future__ import annotations

import random
import urllib.error
import urllib.request
from collections.abc import Callable

from schemas import kafka_clients
from schemas.clock import wall_ms
from schemas.codec import decode, encode
from schemas.contract import PreemptionNotice
from schemas.kafka_config import KafkaSettings
from schemas.signing import Keyring
from surplus.chaos import history as h
from surplus.chaos.forgery import digest, forged
from surplus.chaos.recorder import Recorder
from surplus.chaos.schedule import Fault
from surplus.fleet.fleet import Fleet
from surplus.fleet.procs import POWERFUL_POOL, REGION, RMA_POOL, TopicReader


class Messages:
    """The message faults of one run; each public method injects one, holds it and heals it.

    :param fleet: the running fleet (the powerful replica's URL, the grants, the load's clock).
    :param recorder: where every notice, grant and forgery is recorded.
    :param keyring: the fleet's keyring: genuine notices are signed with it.
    :param kafka: the cluster's settings, to publish notices, targets and forgeries.
    :param targets: a reader following the targets topic: the genuine targets to duplicate,
        reorder and forge from.
    :param seed: the run's seed (notice ids, each fault's own random draws).
    :param hold: waits out a fault's hold (shorter when the run stops).
    :param lend_again: starts a replica's new life after a storm reclaimed it and its pool
        was granted again; says what it did.
    """

    def __init__(self, fleet: Fleet, recorder: Recorder, keyring: Keyring, *,
                 kafka: KafkaSettings, targets: TopicReader, seed: int,
                 hold: Callable[[Fault], None], lend_again: Callable[[str], str]) -> None:
        self.fleet = fleet
        self.rec = recorder
        self.keyring = keyring
        self.kafka = kafka
        self.reader = targets
        self.seed = seed
        self._hold = hold
        self._lend_again = lend_again
        self._sent_notices: list[bytes] = []

    def now(self) -> float:
        """Load time (seconds), the history's time base."""
        return self.fleet.runner.now()

    def _produce(self, topic: str, key: str, value: bytes) -> float | None:
        """Publish and wait for the broker's answer: load time of the ack, None if refused
        or not answered within 30 s."""
        producer = kafka_clients.producer(self.kafka, **{"linger.ms": 0})
        acked: list[float] = []

        def delivered(err: object, _msg: object) -> None:
            if err is None:
                acked.append(self.now())

        producer.produce(self.kafka.topic(topic), key=key.encode(), value=value,
                         on_delivery=delivered)
        producer.flush(30)
        return acked[0] if acked else None

    def _direct(self, notice: PreemptionNotice) -> float | None:
        """POST the signed notice straight to the powerful replica (as its scheduler or
        capacity agent does); load time of its answer, None when it gave none."""
        worker = self.fleet.workers["p1"]
        body = encode(notice)
        headers = {"Content-Type": "application/json",
                   **self.keyring.sign_request(body, wall_ms())}
        req = urllib.request.Request(f"{worker.url}/v1/preempt", data=body, headers=headers,
                                     method="POST")
        try:
            with urllib.request.urlopen(req, timeout=2.0) as resp:
                resp.read()
                return self.now()
        except (urllib.error.URLError, OSError):
            return None

    def _notice(self, pool: str, replicas: list[str], deadline_s: float, n: int
                ) -> h.NoticeRecord:
        """A signed notice reclaiming the whole grant of ``pool`` (or ``replicas`` of it:
        the powerful pool's one replica is all of it), on Kafka and, for the powerful
        pool, straight to its replica."""
        now_ms = wall_ms()
        notice = self.keyring.sign(PreemptionNotice(
            notice_id=f"chaos-{self.seed}-{now_ms}-{n}", ts_ms=now_ms, region=REGION,
            pool_id=pool, replicas=replicas, deadline_ms=now_ms + int(deadline_s * 1000),
            accelerator="a100", accelerator_units=8.0 if pool == POWERFUL_POOL else 4.0))
        t = self.now()
        reclaims = pool == POWERFUL_POOL
        direct = self._direct(notice) if reclaims else None
        acked_t = self._produce("preemption", REGION, encode(notice))
        record = h.NoticeRecord(t=round(t, 3), notice_id=notice.notice_id, pool=pool,
                                replicas=replicas, deadline_t=round(t + deadline_s, 3),
                                acked=acked_t is not None, acked_t=acked_t,
                                reclaims_replica=reclaims, direct_t=direct)
        self.rec.add(record)
        self._sent_notices.append(encode(notice))
        return record

    def _grant(self, pool: str) -> None:
        t = self.now()
        acked = True
        try:
            self.fleet.grant(pool)
        except AssertionError:
            acked = False
        self.rec.add(h.GrantRecord(t=round(t, 3), pool=pool, acked=acked))

    def _rng(self, fault: Fault) -> random.Random:
        return random.Random(f"{self.seed}:{fault.at_s}:{fault.kind}")

    def notice_storm(self, fault: Fault) -> str:
        rng = self._rng(fault)
        size = int(fault.param or "6")
        records = []
        for n in range(size):
            pool, replicas = rng.choice([(POWERFUL_POOL, []), (POWERFUL_POOL, ["p1"]),
                                         (RMA_POOL, [])])
            deadline_s = rng.choice((0.0, 0.5, 1.0, 2.0))
            records.append(self._notice(pool, replicas, deadline_s, n))
        self._hold(fault)
        self._grant(POWERFUL_POOL)
        self._grant(RMA_POOL)
        acked = sum(r.acked for r in records)
        direct = sum(r.direct_t is not None for r in records)
        again = self._lend_again("p1") if any(r.reclaims_replica for r in records) else ""
        return (f"{len(records)} notices ({acked} acked, {direct} straight to p1), "
                f"re-granted{again}")

    def _genuine_targets(self) -> list[bytes]:
        return [m.value() for m in list(self.reader.messages) if m.value()]

    def duplicate(self, fault: Fault) -> str:
        targets = self._genuine_targets()[-3:]
        for value in targets:
            self._produce("targets", REGION, value)
        notices = self._sent_notices[-2:]
        for value in notices:
            notice = decode(PreemptionNotice, value)
            t = self.now()
            acked_t = self._produce("preemption", REGION, value)
            self.rec.add(h.NoticeRecord(t=round(t, 3), notice_id=notice.notice_id,
                                        pool=notice.pool_id, replicas=list(notice.replicas),
                                        deadline_t=round(t, 3), acked=acked_t is not None,
                                        acked_t=acked_t))
        return f"{len(targets)} targets, {len(notices)} notices again"

    def reorder(self, fault: Fault) -> str:
        targets = self._genuine_targets()[-6:]
        for value in reversed(targets):
            self._produce("targets", REGION, value)
        return f"{len(targets)} targets, newest first"

    def forge(self, fault: Fault) -> str:
        topic, how = fault.param.split(":", 1)
        event = forged(topic, how, self._rng(fault), self.keyring, self._genuine_targets)
        value = encode(event)
        t = self.now()
        acked_t = self._produce(topic, REGION, value)
        self.rec.add(h.ForgedRecord(t=round(t, 3), topic=topic, how=how, digest=digest(value),
                                    acked=acked_t is not None))
        return f"{type(event).__name__} {how}"
