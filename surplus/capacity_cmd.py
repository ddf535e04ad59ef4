"""`surplus capacity-agent`: run next to one replica; what it lends and its reclaims go to Kafka."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from surplus.cli_common import (
    Bootstrap,
    Prefix,
    SigningKeyFile,
    fail,
    kafka_settings,
    preflight,
    signing_keys,
)

if TYPE_CHECKING:
    from schemas.contract import CapacityEvent, PreemptionNotice
    from workers.capacity.observe import PlatformReader
    from workers.capacity.platform import Share, Wanted

SOURCES = ("aws", "k8s")


def capacity_agent(
    worker_id: Annotated[str, typer.Option(
        help="The replica's id, as the worker reports it (`surplus worker --worker-id`).")],
    pool: Annotated[str | None, typer.Option(
        help="The replica's pool id region/service/model/accelerator/tier, as the worker "
             "reports it (its /readyz shows pool_id). Without it: --service and --model, "
             "the rest from the platform (labels, EC2 metadata, devices).")] = None,
    service: Annotated[str, typer.Option(help="Without --pool: the pool's service.")]
    = "rank",
    model: Annotated[str, typer.Option(help="Without --pool: the model the worker serves.")]
    = "baseline",
    region: Annotated[str | None, typer.Option(
        help="Without --pool: the region (default: a topology.kubernetes.io/region label, "
             "or the EC2 metadata's placement/region).")] = None,
    accelerator: Annotated[str | None, typer.Option(
        help="Without --pool: the accelerator type (default: a GPU-product label, the "
             "instance type's, or cpu where no GPU is visible).")] = None,
    tier: Annotated[str | None, typer.Option(
        help="Without --pool: baseline or opportunistic (default: opportunistic on a spot "
             "or preemptible machine, by the EC2 metadata or a node label).")] = None,
    source: Annotated[list[str] | None, typer.Option(
        help="aws: poll the EC2 metadata service (spot interruption, rebalance; also the "
             "instance type, lifecycle and region); k8s: serve the termination hook "
             "(preStop, SIGTERM). Repeat for both; none: lend and revoke at exit only.")]
    = None,
    lend: Annotated[bool, typer.Option(
        "--lend/--no-lend", help="Grant an opportunistic replica's share on the capacity "
                                 "topic while it serves (--no-lend: reclaims only, where a "
                                 "scheduler grants the pool).")] = True,
    accelerator_units: Annotated[float | None, typer.Option(
        help="Cap on the GPUs counted; where none is visible (a sidecar), the count itself. "
             "A CPU replica is one unit unless given.")] = None,
    cpu_units: Annotated[float | None, typer.Option(
        help="Cap on the CPU units lent (measured: the cgroup's CPU quota in cores).")] = None,
    cgroup: Annotated[Path | None, typer.Option(
        help="The cgroup directory whose CPU quota is lent, or a cgroupfs root such as the "
             "worker's /proc/1/root/sys/fs/cgroup for a sidecar sharing its processes "
             "(default: the agent's own cgroup, and those above it).")] = None,
    cpu_limit_file: Annotated[Path | None, typer.Option(
        help="Instead: a file holding the worker container's CPU limit in millicores (the "
             "Kubernetes downward API's limits.cpu, divisor 1m), the figure its quota is "
             "set from.")] = None,
    labels_file: Annotated[list[Path] | None, typer.Option(
        help="A downward-API labels or annotations file (key=\"value\" lines). Repeat.")]
    = None,
    label: Annotated[list[str] | None, typer.Option(
        help="A node or pod label key=value, over the files'. Repeat.")] = None,
    lease_s: Annotated[float, typer.Option(
        help="How long each grant holds unless renewed.")] = 15.0,
    renew_s: Annotated[float, typer.Option(
        help="Seconds between renewals (at most half the lease; ticks every --poll-s).")]
    = 5.0,
    imds_endpoint: Annotated[str, typer.Option(
        help="EC2 instance metadata service (IMDSv2).")] = "http://169.254.169.254",
    poll_s: Annotated[float, typer.Option(
        help="Seconds between metadata polls and lending ticks.")] = 2.0,
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
        help="The replica's own base URL (http://127.0.0.1:PORT in its pod): its /readyz "
             "says whether it serves (and which pool), so the share is lent only then; each "
             "notice is also posted to its /v1/preempt, so it stops optional work without "
             "waiting for Kafka's delivery.")] = None,
    signing_key_file: SigningKeyFile = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "info",
) -> None:
    """Lend an opportunistic replica's capacity while it serves; announce when it is taken back."""
    from workers.capacity.agent import CapacityAgent, EventSender, probe_worker, serve_hook
    from workers.capacity.decide import NoticeDecider, Replica
    from workers.capacity.direct import DirectNotices
    from workers.capacity.imds import Imds
    from workers.capacity.lend import Lender, LendSettings
    from workers.capacity.observe import PlatformReader, read_quota
    from workers.capacity.platform import PlatformError, Wanted, kubelet_quota

    logging.basicConfig(level=loglevel.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sources = list(source or [])
    unknown = sorted(set(sources) - set(SOURCES))
    if unknown:
        fail(f"--source {', '.join(unknown)}: give aws and/or k8s")
    if on_rebalance not in ("log", "notice"):
        fail(f"--on-rebalance {on_rebalance!r}: give log or notice")
    if poll_s <= 0 or grace_s < 0 or rebalance_deadline_s < 0:
        fail("--poll-s must be positive, --grace-s and --rebalance-deadline-s not negative")
    if worker_url is not None and not worker_url.startswith(("http://", "https://")):
        fail(f"--worker-url {worker_url!r}: give the replica's base URL, http://host:port")
    for flag, units in (("--accelerator-units", accelerator_units), ("--cpu-units", cpu_units)):
        if units is not None and not units >= 0:
            fail(f"{flag} {units}: must not be negative")
    labels = {}
    for pair in label or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            fail(f"--label {pair!r}: give key=value")
        labels[key.strip()] = value
    for path in labels_file or []:
        if not path.is_file():
            fail(f"--labels-file {path}: no such file")
    if cgroup is not None and cpu_limit_file is not None:
        fail("--cgroup and --cpu-limit-file: give one (both say what CPU the replica has)")
    if cgroup is not None:
        try:
            read_quota(cgroup)
        except (OSError, ValueError) as exc:
            fail(f"--cgroup {cgroup}: no CPU quota to read there ({exc})")
    if cpu_limit_file is not None:
        try:
            kubelet_quota(cpu_limit_file.read_text())
        except (OSError, ValueError) as exc:
            fail(f"--cpu-limit-file {cpu_limit_file}: {exc}")
    try:
        settings = LendSettings(lease_s=lease_s, renew_s=renew_s)
    except ValueError as exc:
        fail(f"--lease-s/--renew-s: {exc}")
    try:
        wanted = (Wanted.from_pool(pool, accelerator_units=accelerator_units,
                                   cpu_units=cpu_units) if pool else
                  Wanted(service=service, model=model, region=region, accelerator=accelerator,
                         tier=tier, accelerator_units=accelerator_units, cpu_units=cpu_units))
        imds = Imds(imds_endpoint) if "aws" in sources else None
    except (PlatformError, ValueError) as exc:
        fail(f"--pool: {exc}" if isinstance(exc, PlatformError) else str(exc))
    reader = PlatformReader(imds=imds, cgroup_dir=cgroup, cpu_limit_file=cpu_limit_file,
                            labels_files=tuple(labels_file or ()), labels=labels)
    first = _first_share(reader, wanted, poll_s)
    if first is None:
        return  # stopped while waiting for the metadata service
    if not sources and not (lend and first.identity.lends):
        fail(f"nothing to do: pool {first.pool_id} is not lent (only opportunistic capacity "
             "is, and --no-lend stops it) and no --source reports reclaims")
    keys = signing_keys(signing_key_file)
    kafka = kafka_settings(bootstrap, prefix)
    preflight(kafka, timeout_s=5.0)
    sender = EventSender(kafka, client_id=f"surplus-capacity-agent-{worker_id}")
    replica_urls = [] if worker_url is None else [worker_url]
    direct = DirectNotices(keys=keys) if replica_urls else None
    if direct is not None:
        direct.warm(replica_urls)
    try:
        decider = NoticeDecider(
            Replica(worker_id=worker_id, pool_id=first.pool_id,
                    accelerator_units=first.accelerator_units, cpu_units=first.cpu_units),
            on_rebalance=on_rebalance,  # type: ignore[arg-type]
            rebalance_deadline_s=rebalance_deadline_s)
    except ValueError as exc:
        fail(str(exc))

    def send(notice: PreemptionNotice) -> bool:
        if keys is not None:
            notice = keys.sign(notice)
        if direct is not None:
            direct.send(notice, replica_urls)  # the replica first; Kafka tells the rest
        return sender.send(notice)

    def send_capacity(event: CapacityEvent) -> bool:
        return sender.send(event if keys is None else keys.sign(event))

    lending = lend and first.identity.lends
    agent = CapacityAgent(
        decider, send, imds=imds, poll_s=poll_s, grace_s=grace_s,
        lender=Lender(worker_id, settings) if lending else None,
        share=_shares(reader, wanted) if lending else None,
        send_capacity=send_capacity if lending else None,
        probe=(lambda: probe_worker(worker_url)) if worker_url is not None else None)

    signalled: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        # Only flags here: the handler runs on the main thread, which may hold the agent's
        # lock mid-poll. The notice and the revoke go out as soon as `run` returns, below.
        signalled.append(signum)
        agent.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if "k8s" in sources:
        try:
            hook = serve_hook(agent, hook_host, hook_port)
        except OSError as exc:
            fail(f"cannot serve the termination hook on {hook_host}:{hook_port}: {exc}")
        typer.echo(f"capacity agent: termination hook on "
                   f"http://{hook_host}:{hook.server_address[1]}/prestop", err=True)
    whence = ", ".join(f"{k}: {v}" for k, v in first.sources.items())
    lent = (f"lends {first.accelerator_units:g} {first.identity.accelerator} units and "
            f"{first.cpu_units:g} CPU units ({whence})" if lending else "lends nothing")
    typer.echo(f"capacity agent for {worker_id} ({first.pool_id}): {lent}; sources "
               f"{', '.join(sources) or 'none'}"
               + (f", polling {imds_endpoint} every {poll_s:g} s" if imds else ""), err=True)
    try:
        agent.run()
        if signal.SIGTERM in signalled and "k8s" in sources:  # a sidecar's SIGTERM: the pod ends
            agent.terminate("sigterm")
        agent.close()
    finally:
        sender.close()
        if direct is not None:
            direct.close()


def _first_share(reader: PlatformReader, wanted: Wanted, poll_s: float) -> Share | None:
    """The replica's pool and units at start. A part the metadata service would give waits
    for it to answer (said once); anything else missing stops the process, naming the
    setting. None: SIGTERM or SIGINT came while waiting."""
    from workers.capacity.platform import PlatformError, share

    stopped: list[int] = []
    previous = {s: signal.signal(s, lambda n, _f: stopped.append(n))
                for s in (signal.SIGTERM, signal.SIGINT)}
    said = ""
    try:
        while not stopped:
            view = reader.view()
            try:
                return share(wanted, view)
            except PlatformError as exc:
                if not reader.imds_pending:
                    fail(str(exc))
                why = "; ".join(reader.problems.values())
                if why != said:
                    typer.echo(f"capacity agent: waiting for the metadata service ({exc}): "
                               f"{why}", err=True)
                    said = why
            time.sleep(poll_s)
        return None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _shares(reader: PlatformReader, wanted: Wanted) -> Callable[[], Share | None]:
    """What the replica lends at each tick, read afresh (a resized quota, a relabelled pod);
    a reading problem or a share the platform no longer makes is logged once per change."""
    from workers.capacity.platform import PlatformError, share
    from workers.capacity.quiet import OncePerChange

    quiet = OncePerChange(lambda line: logging.getLogger("surplus.capacity_agent")
                          .warning("%s", line))
    seen: set[str] = set()

    def current() -> Share | None:
        view = reader.view()
        for key, line in reader.problems.items():
            quiet.problem(key, line)
        for key in seen - set(reader.problems):
            quiet.fine(key)
        seen.clear()
        seen.update(reader.problems)
        try:
            now = share(wanted, view)
        except PlatformError as exc:
            quiet.problem("share", f"nothing lent now: {exc}")
            return None
        quiet.fine("share", f"lending again: {now.pool_id}")
        return now

    return current
