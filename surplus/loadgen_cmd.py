"""`surplus loadgen`: a ranking service's traffic from a scenario, through the ranking client."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Annotated

import typer

from surplus.cli_common import (
    Bootstrap,
    MetricsHost,
    MetricsPort,
    Prefix,
    SigningKeyFile,
    fail,
    kafka_settings,
    signing_keys,
)

Urls = Annotated[list[str] | None, typer.Option(help="Worker base URL (repeatable).")]


def loadgen(
    baseline_url: Urls = None,
    powerful_url: Urls = None,
    scenario: Annotated[str, typer.Option(
        help="Scenario TOML, or the name of one in sim/scenarios.")] = "demo",
    region: Annotated[str | None, typer.Option(help="Region of the scenario (default: first).")]
    = None,
    duration: Annotated[float | None, typer.Option(
        help="Seconds of traffic (default: the scenario's duration).")] = None,
    rate: Annotated[float | None, typer.Option(
        help="Mean requests/s (default: the scenario's arrivals.mean_rps).")] = None,
    start_at_ms: Annotated[int | None, typer.Option(
        help="Wall-clock ms the arrivals start at (default: now).")] = None,
    out: Annotated[Path, typer.Option(help="Directory for requests.csv, loadgen.json(l).")]
    = Path("out/loadgen"),
    metrics_port: MetricsPort = 0,
    metrics_host: MetricsHost = "127.0.0.1",
    kafka: Annotated[bool, typer.Option(
        "--kafka/--no-kafka", help="Follow targets and publish outcomes (else baseline only).")]
    = True,
    membership: Annotated[bool, typer.Option(
        "--membership/--no-membership",
        help="Route to the replicas announced on the replicas topic (needs Kafka); the "
             "--*-url lists then serve only while none is live.")] = False,
    signing_key_file: SigningKeyFile = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
) -> None:
    """Send a scenario's traffic (e.g. the Azure trace) through the ranking client.

    Runs until the duration ends or SIGTERM / Ctrl-C, then writes requests.csv, loadgen.jsonl
    and loadgen.json to --out.
    """
    from schemas.clock import wall_ms
    from sim.scenario import ScenarioError
    from surplus.live import plan
    from surplus.live.loadgen import run_loadgen

    if not baseline_url and not membership:
        fail("give at least one --baseline-url (a ranking worker), or --membership")
    if membership and not kafka:
        fail("--membership reads the replicas topic: it needs --kafka")
    try:
        scn, base = plan.load(scenario)
        reg = plan.region_of(scn, region)
    except ScenarioError as exc:
        fail(str(exc))
    seconds = duration if duration is not None else scn.duration_s
    if seconds <= 0 or (rate is not None and rate <= 0):
        fail("--duration and --rate must be > 0")
    settings = kafka_settings(bootstrap, prefix) if kafka else None
    keys = signing_keys(signing_key_file)

    async def main() -> dict[str, object]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        return await run_loadgen(
            scn, reg, base, baseline_urls=list(baseline_url or []),
            powerful_urls=list(powerful_url or []), kafka=settings, out=out,
            start_ms=start_at_ms if start_at_ms is not None else wall_ms(),
            duration_s=seconds, stop=stop, rate=rate, metrics_port=metrics_port,
            membership=membership, signing_key=keys,
            metrics_host=metrics_host,
            say=lambda line: typer.echo(line))

    try:
        summary = asyncio.run(main())
    except (RuntimeError, ScenarioError, OSError) as exc:
        fail(str(exc))
    typer.echo(f"loadgen done: {summary['requests']} requests, {summary['failed']} failed, "
               f"{summary['served_powerful']} on the powerful model, "
               f"{summary['extra_scored']} extra candidates scored -> {out}")
