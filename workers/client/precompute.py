"""The client's half of the precompute lever: jobs it asks for, answers it follows.

A service asks for a user's candidates to be scored ahead of the user's next request
(`PrecomputeSide.ask`: a `PrecomputeJob` on the precompute topic, keyed by the user), and the
lent replicas answer in their idle time on the compacted cache topic. `CacheFeed` follows that
topic from its beginning (no group state, like the targets feed) into `Answers`, on the
client's loop; `PrecomputeSide.answer` says whether a request may use one now. What a hit is
worth (a ranking of more candidates than a request can wait for, with the request's own extras
saved) is the service's to count; the load generator counts both (`surplus.live`).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from schemas.codec import codec_for, encode
from schemas.contract import AnswerUse, ModelKind
from schemas.kafka_clients import Message, Producer
from schemas.kafka_config import KafkaSettings
from schemas.precompute import PrecomputeJob, PrecomputeResult
from workers.api import MAX_DEADLINE_MS, Candidate, RankRequest
from workers.client.feed import CompactedFeed, DeadLetterSink
from workers.client.kafka_side import on_loop
from workers.policy.holdout import answer_use, in_holdout
from workers.policy.precomputed import Answers, JobWindow
from workers.wire import FeatureValue, encode_rank_request

#: Requests whose answer's fate is held for their decision record (`PrecomputeSide.take`).
USES_HELD = 65_536


class CacheFeed(CompactedFeed):
    """Follows the cache topic: every answer, handed to ``deliver`` on the feed's thread."""

    logical = "cache"

    def __init__(self, kafka: KafkaSettings, scope: str,
                 deliver: Callable[[PrecomputeResult], None],
                 dead_letter: DeadLetterSink | None = None,
                 poll_timeout_s: float = 0.1) -> None:
        super().__init__(kafka, scope, dead_letter, poll_timeout_s)
        self._deliver = deliver
        self._codec = codec_for(PrecomputeResult)

    def _handle(self, msg: Message) -> None:
        value = msg.value()
        if value is None:
            self._bump("tombstone")
            return
        result = self._decoded(self._codec, msg, value)
        if result is None:
            return
        self._bump("received")
        self._deliver(result)


class PrecomputeSide:
    """Asks for jobs and holds their answers; use it from the client's event loop.

    :param scope: the client's region: only its answers are held.
    :param kafka: the cluster and topic prefix.
    :param producer: the client's producer (jobs go out with its records).
    :param clock: wall-clock milliseconds.
    :param dead_letter: where an answer that does not decode goes.
    :param holdout_fraction: the client's holdout (`ClientConfig.holdout_fraction`).
    :param answer_holdout_fraction: the share of requests holding an answer that are ranked
        without it (`ClientConfig.answer_holdout_fraction`).
    """

    def __init__(self, scope: str, kafka: KafkaSettings, producer: Producer,
                 clock: Callable[[], int], dead_letter: DeadLetterSink | None = None,
                 holdout_fraction: float = 0.0, answer_holdout_fraction: float = 0.0) -> None:
        self.scope = scope
        self.holdout_fraction = holdout_fraction
        self.answer_holdout_fraction = answer_holdout_fraction
        #: What became of each request's answer, until its decision record takes it
        #: (`take`); the oldest are dropped past ``USES_HELD``.
        self._uses: OrderedDict[str, AnswerUse] = OrderedDict()
        self.withheld = 0
        self.kafka = kafka
        self.producer = producer
        self.clock = clock
        self.answers = Answers(scope)
        #: Jobs in flight per model, held to what its replicas measurably answer
        #: (`JobWindow`): one model's slow replicas do not hold the other's jobs back.
        self.windows: dict[str, JobWindow] = {}
        self._dead_letter = dead_letter
        self.feed: CacheFeed | None = None
        self.asked = 0
        self.ask_failed = 0

    def start(self) -> None:
        """Follow the cache topic; answers reach `answers` on the running loop."""
        loop = asyncio.get_running_loop()
        self.feed = CacheFeed(self.kafka, self.scope,
                              lambda result: on_loop(loop, self._answered, result),
                              self._dead_letter)
        self.feed.start()

    async def stop(self) -> None:
        if self.feed is not None:
            await asyncio.to_thread(self.feed.stop)

    def _answered(self, result: PrecomputeResult) -> None:
        self.answers.add(result)
        self._window(result.model).answered(result.job_key)

    def _window(self, model: str) -> JobWindow:
        return self.windows.setdefault(model, JobWindow())

    def room(self, model: ModelKind) -> int:
        """Jobs for ``model`` that may be asked for now: its replicas' measured answers,
        less those in flight (`JobWindow`)."""
        return self._window(model).room(self.clock())

    def answer(self, job_key: str, request_id: str | None = None) -> PrecomputeResult | None:
        """The answer a request of ``job_key`` may use now (counted as a hit or a miss);
        none for a request in the holdout (by ``request_id``, as `RankingClient.rank`
        decides it), which gets no optional work of any kind, so its lift stays measurable.

        A fresh answer returned is taken as used by request ``request_id``; one the answer
        holdout withholds is not returned, and the request is ranked live as if there were
        none. Either way its decision record says so (`take`), which is what the control plane
        measures the lever's lift by."""
        if request_id is not None and in_holdout(request_id, self.holdout_fraction):
            return None
        found = self.answers.fresh(job_key, self.clock())
        if found is None or request_id is None:
            return found
        use = answer_use(request_id, self.answer_holdout_fraction)
        if use == "withheld" and self._uses.get(request_id) != "withheld":
            self.withheld += 1
        self._uses[request_id] = use
        self._uses.move_to_end(request_id)
        while len(self._uses) > USES_HELD:
            self._uses.popitem(last=False)
        return found if use == "used" else None

    def take(self, request_id: str) -> AnswerUse | None:
        """What became of the answer request ``request_id`` held (None: it held none)."""
        return self._uses.pop(request_id, None)

    def ask(self, job_key: str, *, segment: str, model: ModelKind,
            candidates: Sequence[Candidate], dense: Sequence[float] = (),
            features: Mapping[str, FeatureValue] | None = None, ttl_ms: int = 60_000,
            top: int = 100) -> None:
        """Send a job: score these candidates with ``model`` before ``job_key`` comes back.

        :param ttl_ms: how long the answer is worth using (and the job worth doing).
        :param top: the best candidates the answer keeps.
        """
        now = self.clock()
        body = encode_rank_request(
            RankRequest(request_id=job_key, segment=segment, value=0.0,
                        deadline_ms=min(float(ttl_ms), MAX_DEADLINE_MS),
                        dense=list(dense), candidates=list(candidates), base_count=0),
            "msgpack", features)
        job = PrecomputeJob(job_key=job_key, scope=self.scope, segment=segment, model=model,
                            issued_at_ms=now, expires_at_ms=now + ttl_ms, body=body, top=top)
        try:
            self.producer.produce(self.kafka.topic("precompute"), key=job_key.encode(),
                                  value=encode(job))
        except BufferError:
            self.ask_failed += 1
            return
        self.asked += 1
        self._window(model).asked(job_key, job.expires_at_ms)

    def summary(self) -> dict[str, Any]:
        feed = self.feed
        return {"asked": self.asked, "ask_failed": self.ask_failed,
                "answer_rate": {m: round(w.answer_rate, 3) for m, w in sorted(
                    self.windows.items())},
                "answers_held": len(self.answers), "answers": dict(sorted(
                    self.answers.counts.items())), "answers_withheld": self.withheld,
                "feed": {} if feed is None else dict(sorted(feed.counters.items()))}
