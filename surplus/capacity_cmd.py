"""`surplus capacity-agent`: run next to one replica; its platform's reclaims become notices."""

from __future__ import annotations

import logging
import signal
from typing import TYPE_CHECKING, Annotated, Any

import typer

from surplus.cli_common import Bootstrap, Prefix, fail, kafka_settings, preflight

if TYPE_CHECKING:
    from schemas.contract import PreemptionNotice

SOURCES = ("aws", "k8s")


def capacity_agent(
    worker_id: Annotated[str, typer.Option(
        help="The replica's id, as the worker reports it (`surplus worker --worker-id`).")],
    pool: Annotated[str, typer.Option(
        help="The replica's pool id region/service/model/accelerator/tier, as the worker "
             "reports it (its /readyz shows pool_id).")],
    source: Annotated[list[str], typer.Option(
        help="aws: poll the EC2 metadata service (spot interruption, rebalance); k8s: serve "
             "the termination hook (preStop, SIGTERM). Repeat for both.")],
    accelerator_units: Annotated[float, typer.Option(
        help="Accelerator units the replica holds (what a reclaim takes off its pool).")] = 1.0,
    cpu_units: Annotated[float, typer.Option(help="CPU units the replica holds.")] = 0.0,
    imds_endpoint: Annotated[str, typer.Option(
        help="EC2 instance metadata service (IMDSv2).")] = "http://169.254.169.254",
    poll_s: Annotated[float, typer.Option(help="Seconds between metadata polls.")] = 2.0,
    on_rebalance: Annotated[str, typer.Option(
        help="log: a rebalance recommendation is only logged; notice: reclaim the replica "
             "--rebalance-deadline-s after it.")] = "log",
    rebalance_deadline_s: Annotated[float, typer.Option(
        help="With --on-rebalance notice: the deadline after the recommendation.")] = 120.0,
    grace_s: Annotated[float, typer.Option(
        help="The pod's grace period (terminationGracePeriodSeconds): the notice a preStop "
             "call or SIGTERM gives.")] = 30.0,
    hook_host: Annotated[str, typer.Option(help="Address of the termination hook.")]
    = "127.0.0.1",
    hook_port: Annotated[int, typer.Option(help="Port of the termination hook (k8s).")] = 8089,
    worker_url: Annotated[str | None, typer.Option(
        help="The replica's own base URL (http://127.0.0.1:PORT in its pod): each notice is "
             "also posted to its /v1/preempt, so it stops optional work without waiting for "
             "Kafka's delivery.")] = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "info",
) -> None:
    """Send a PreemptionNotice for this replica when its machine is being taken back."""
    from workers.capacity.agent import CapacityAgent, NoticeSender, serve_hook
    from workers.capacity.decide import NoticeDecider, Replica
    from workers.capacity.direct import DirectNotices
    from workers.capacity.imds import Imds

    logging.basicConfig(level=loglevel.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    unknown = sorted(set(source) - set(SOURCES))
    if unknown or not source:
        fail(f"--source {', '.join(unknown) or '(none)'}: give aws and/or k8s")
    if on_rebalance not in ("log", "notice"):
        fail(f"--on-rebalance {on_rebalance!r}: give log or notice")
    if poll_s <= 0 or grace_s < 0 or rebalance_deadline_s < 0:
        fail("--poll-s must be positive, --grace-s and --rebalance-deadline-s not negative")
    if worker_url is not None and not worker_url.startswith(("http://", "https://")):
        fail(f"--worker-url {worker_url!r}: give the replica's base URL, http://host:port")
    try:
        replica = Replica(worker_id=worker_id, pool_id=pool,
                          accelerator_units=accelerator_units, cpu_units=cpu_units)
        decider = NoticeDecider(replica, on_rebalance=on_rebalance,  # type: ignore[arg-type]
                                rebalance_deadline_s=rebalance_deadline_s)
        imds = Imds(imds_endpoint) if "aws" in source else None
    except ValueError as exc:
        fail(str(exc))
    kafka = kafka_settings(bootstrap, prefix)
    preflight(kafka, timeout_s=5.0)
    sender = NoticeSender(kafka, client_id=f"surplus-capacity-agent-{worker_id}")
    replica_urls = [] if worker_url is None else [worker_url]
    direct = DirectNotices() if replica_urls else None

    def send(notice: PreemptionNotice) -> bool:
        if direct is not None:
            direct.send(notice, replica_urls)  # the replica first; Kafka tells the rest
        return sender.send(notice)

    agent = CapacityAgent(decider, send, imds=imds, poll_s=poll_s, grace_s=grace_s)

    terminated: list[int] = []

    def on_sigterm(signum: int, _frame: Any) -> None:
        # Only flags here: the handler runs on the main thread, which may hold the agent's
        # lock mid-poll. The notice goes out as soon as `run` returns, below.
        terminated.append(signum)
        agent.stop.set()

    signal.signal(signal.SIGTERM, on_sigterm)
    if "k8s" in source:
        try:
            hook = serve_hook(agent, hook_host, hook_port)
        except OSError as exc:
            fail(f"cannot serve the termination hook on {hook_host}:{hook_port}: {exc}")
        typer.echo(f"capacity agent: termination hook on "
                   f"http://{hook_host}:{hook.server_address[1]}/prestop", err=True)
    typer.echo(f"capacity agent for {worker_id} ({pool}): sources {', '.join(source)}"
               + (f", polling {imds_endpoint} every {poll_s:g} s" if imds else ""), err=True)
    try:
        agent.run()
        if terminated and "k8s" in source:  # a sidecar's SIGTERM is the pod's end
            agent.terminate("sigterm")
    except KeyboardInterrupt:
        pass
    finally:
        sender.close()
        if direct is not None:
            direct.close()
