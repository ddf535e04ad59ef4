"""Configuration of the client library a ranking service embeds (TOML-loadable, strict)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from workers.policy.baseline_retry import RetryConfig
from workers.policy.client_shed import ShedConfig
from workers.policy.membership import MembershipLimits
from workers.policy.powerful_hedge import HedgeConfig
from workers.policy.routing import RouterConfig
from workers.policy.targets import LocalLimits

Url = Annotated[str, Meta(pattern=r"^https?://", max_length=500)]
Ms = Annotated[float, Meta(gt=0.0, le=600_000.0)]


class ClientConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Where the worker pools are, how long each call may take, and the local policies."""

    #: The region this client serves; only targets for it apply.
    scope: Annotated[str, Meta(min_length=1, max_length=200)]
    #: Route to the live replicas announced on the replicas topic (needs Kafka): replicas
    #: that are draining or whose lease ran out leave the set before they go. The fixed URLs
    #: below then serve only while the topic names no live replica of a pool.
    membership: bool = False
    #: Base URLs of the baseline pool (provisioned): every request can be served here. Needed
    #: unless `membership` is on.
    baseline_urls: list[Url] = []
    #: Base URLs of the powerful pool (opportunistic); empty means no SBM routing, unless
    #: `membership` is on (then the powerful replicas announced are routed to).
    powerful_urls: list[Url] = []
    #: Deadline of a request when the caller gives none.
    default_deadline_ms: Ms = 100.0
    #: Share of the deadline a powerful call may use; the rest is kept for the baseline fallback.
    powerful_deadline_share: Annotated[float, Meta(gt=0.0, lt=1.0)] = 0.6
    #: How long a baseline call may take before it counts as failed (baseline is never dropped
    #: for being slow: this only bounds a hung connection).
    baseline_timeout_ms: Ms = 2_000.0
    #: A baseline call not answered within a share of the deadline (a frozen or hung
    #: replica) while another replica is left: the request is hedged there, within a hedge
    #: budget, and a replica the hedge beat skipped for a while
    #: (`workers.policy.baseline_retry`).
    baseline_retry: RetryConfig = RetryConfig()
    #: A powerful call late by the pool's measured latency (a multiple of its recent p99) is
    #: hedged on the baseline pool, within a hedge budget; the first answer serves
    #: (`workers.policy.powerful_hedge`).
    powerful_hedge: HedgeConfig = HedgeConfig()
    #: This client's share of the fleet's RMA budget (e.g. 1 / number of client instances).
    rma_budget_share: Annotated[float, Meta(ge=0.0, le=1.0)] = 1.0
    #: Seconds of RMA budget the bucket may bank.
    rma_burst_s: Annotated[float, Meta(gt=0.0, le=60.0)] = 1.0
    #: Seed of the router's generator (routing is deterministic given it).
    seed: int = 0
    #: Follow the precompute lever's answers (the cache topic, needs Kafka): `RankingClient`'s
    #: ``precompute`` asks for jobs and says which requests have an answer waiting.
    precompute: bool = False
    #: Publish a decision record (RoutingOutcome) per request to the outcomes topic, in
    #: batches of up to `decision_batch_max`, at least every `decision_linger_ms`.
    publish_outcomes: bool = True
    decision_batch_max: Annotated[int, Meta(ge=1, le=10_000)] = 500
    decision_linger_ms: Annotated[float, Meta(ge=0.0, le=60_000.0)] = 200.0
    #: Share of decision records published, in (0, 1], picked by request-id hash
    #: (`workers.policy.sampling`: every process and a replay agree). A sampled record says
    #: its inclusion probability, so the control plane weighs it back up; holdout records
    #: are always published. At 10^5 requests/s, 0.01 leaves the join 10^3 records a second.
    #: Labels of requests not logged are not sent either. Before lowering it, the control
    #: plane must read contract v9.
    decision_sample: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    #: Share of requests (by request-id hash) in the randomized holdout: no optional work, so
    #: the control plane can measure the lift of the rest against them.
    holdout_fraction: Annotated[float, Meta(ge=0.0, le=0.5)] = 0.01
    #: Share of the requests holding a fresh precompute answer (by request-id hash) that are
    #: ranked live without it, so the control plane can measure what answers pay against them
    #: (`workers.policy.holdout.withholds_answer`); what it costs is that share of the hits.
    answer_holdout_fraction: Annotated[float, Meta(ge=0.0, le=0.5)] = 0.05
    #: A replica that refused a connection or dropped one mid-request, or a powerful one that
    #: did not answer within the powerful wait (frozen, swamped), is skipped this long (while
    #: another replica of its pool is left).
    replica_down_s: Annotated[float, Meta(ge=0.0, le=600.0)] = 1.0
    #: How requests travel to the workers: ``msgpack`` (candidates as raw numpy columns: a
    #: worker turns 2,000 into the model's arrays in 40 us where JSON takes 1.3 ms, from a body
    #: a third the size; `surplus bench transport`) or ``json`` (readable on the wire, what
    #: curl sends). Either way the answer is read in whichever of the two the worker sent.
    encoding: Literal["msgpack", "json"] = "msgpack"
    #: Connections per worker host.
    max_connections: Annotated[int, Meta(ge=1, le=10_000)] = 100
    #: Seconds `start()` waits to read the targets topic up to its end (then serves baseline only
    #: until targets arrive).
    catch_up_timeout_s: Annotated[float, Meta(ge=0.0, le=600.0)] = 10.0
    limits: LocalLimits = LocalLimits()
    membership_limits: MembershipLimits = MembershipLimits()
    router: RouterConfig = RouterConfig()
    shed: ShedConfig = ShedConfig()

    def __post_init__(self) -> None:
        if not self.membership and not self.baseline_urls:
            raise ValueError("`baseline_urls` is empty and `membership` is off: the client "
                             "has no replica to send baseline work to")


def powerful_wait_ms(deadline_ms: float, share: float) -> float:
    """How long a client waits for the powerful model before it falls back to the baseline
    pool with the rest of the deadline (``powerful_deadline_share``). The live client, the
    simulated one and the scenario check that the SBM SLA fits in it all use this."""
    return deadline_ms * share
