"""`surplus override set|clear|list`: an operator's kill switch and caps on optional work.

An override is one message on the compacted overrides topic, keyed by scope: the latest one per
scope is the whole override (``schemas.contract.OperatorOverride``). The control plane that owns
the scope reads it like any other input; a kill goes out as baseline-only targets at once, the
other limits at the next period, and every override lapses at its TTL, so a cap set during an
incident and forgotten does not hold optional work down for good.

Where the control plane holds a signing key, an override is signed by the operator who sets
it (``--signing-key-file``, the keyring's signing key): the overrides topic is the kill switch,
so a principal that can write it but lacks the key cannot shed the fleet's optional work.
"""

from __future__ import annotations

import getpass
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from schemas.codec import ContractError, decode, encode
from schemas.contract import OperatorOverride
from schemas.kafka_config import KafkaSettings
from surplus.cli_common import (
    Bootstrap,
    Prefix,
    SigningKeyFile,
    fail,
    kafka_settings,
    signing_keys,
)

override_app = typer.Typer(no_args_is_help=True,
                           help="An operator's kill switch and caps on optional work, per scope.")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
MAX_TTL_MS = 30 * 86_400_000

Scope = Annotated[str, typer.Option("--scope", help="Region the override is for (e.g. eu1).")]
Reason = Annotated[str, typer.Option(
    "--reason", help="Why (required; shown in logs, the event log and `override list`).")]
Ttl = Annotated[str, typer.Option(
    "--ttl", help="How long it holds: 90s, 30m, 2h, 1d (or seconds); it lapses by itself.")]
By = Annotated[str | None, typer.Option("--by", help="Who set it (default: the login name).")]


def parse_ttl(text: str) -> int:
    """A duration such as ``30m`` in ms; the error says what was expected."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"--ttl {text!r}: expected a number with ms, s, m, h or d (e.g. 30m)")
    ms = round(float(match.group(1)) * _UNIT_MS[match.group(2) or "s"])
    if not 0 < ms <= MAX_TTL_MS:
        raise ValueError(f"--ttl {text!r}: must be more than 0 and at most 30d")
    return ms


def publish(settings: KafkaSettings, override: OperatorOverride,
            timeout_s: float = 15.0) -> tuple[int, int]:
    """Write ``override`` keyed by its scope and wait for the cluster's acknowledgement;
    the partition and offset it got. Sent as a preemption notice is (no linger, no Nagle): a
    kill is as urgent."""
    from schemas.kafka_clients import notice_producer

    out = notice_producer(settings)
    answer: list[tuple[int, int] | Exception] = []

    def delivered(err: object, msg: object) -> None:
        if err is not None:
            answer.append(RuntimeError(f"not written: {err}"))
        else:
            answer.append((msg.partition(), msg.offset()))  # type: ignore[attr-defined]

    out.produce(settings.topic("overrides"), key=override.scope.encode(),
                value=encode(override), on_delivery=delivered)
    out.flush(timeout_s)
    if not answer:
        raise RuntimeError(f"no answer from {settings.bootstrap} within {timeout_s:.0f}s")
    if isinstance(answer[0], Exception):
        raise answer[0]
    return answer[0]


def read_all(settings: KafkaSettings, timeout_s: float = 30.0
             ) -> tuple[list[OperatorOverride], list[str]]:
    """The latest override of every scope (compacted topic read to its end), and a line for
    each value that does not satisfy the contract."""
    from schemas import kafka_clients
    from streams.agents.changelog import read_changelog

    topic = settings.topic("overrides")
    partitions = kafka_clients.partitions(kafka_clients.admin(settings), topic, timeout_s)
    latest = read_changelog(settings, topic, partitions, timeout_s)
    found, bad = [], []
    for scope in sorted(latest):
        try:
            found.append(decode(OperatorOverride, latest[scope]))
        except ContractError as exc:
            bad.append(f"{scope}: {exc}")
    return found, bad


def utc(ms: int) -> str:
    """A time in ms as UTC to the second (how `override set` and `list` show the TTL's end)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _send(override: OperatorOverride, bootstrap: str | None, prefix: str | None,
          signing_key_file: Path | None = None) -> None:
    from streams.control.override import describe

    settings = kafka_settings(bootstrap, prefix)
    keys = signing_keys(signing_key_file, reload_s=0)
    if keys is not None:
        override = keys.sign(override)
    try:
        partition, offset = publish(settings, override)
    except (RuntimeError, ValueError) as exc:
        fail(str(exc))
    typer.echo(f"{describe(override, utc)} [{settings.topic('overrides')}[{partition}]@{offset}]")


def _make(**fields: object) -> OperatorOverride:
    """The override, checked as the control plane will check it (a bad one is never sent)."""
    from schemas.clock import wall_ms

    try:
        return decode(OperatorOverride, encode(OperatorOverride(
            issued_at_ms=wall_ms(), **fields)))  # type: ignore[arg-type]
    except (ContractError, ValueError, TypeError) as exc:
        fail(str(exc))


@override_app.command("set")
def override_set(
    scope: Scope,
    reason: Reason,
    kill: Annotated[bool, typer.Option(
        "--kill", help="Baseline only: no optional work. Reaches workers at once.")] = False,
    freeze: Annotated[bool, typer.Option(
        "--freeze", help="Hold the current targets (a preemption still lowers them).")]
    = False,
    max_extra: Annotated[int | None, typer.Option(
        "--max-extra", min=0, max=10_000, help="At most N extra candidates per request.")]
    = None,
    max_coverage: Annotated[float | None, typer.Option(
        "--max-coverage", min=0.0, max=1.0,
        help="At most this share of requests on the powerful model.")] = None,
    ttl: Ttl = "1h",
    by: By = None,
    signing_key_file: SigningKeyFile = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
) -> None:
    """Set the scope's override (it replaces the one before); caps apply at the next period."""
    try:
        ttl_ms = parse_ttl(ttl)
    except ValueError as exc:
        fail(str(exc))
    _send(_make(scope=scope, action="set", ttl_ms=ttl_ms, reason=reason,
                by=by or getpass.getuser(), kill=kill, freeze=freeze, max_extra=max_extra,
                max_coverage=max_coverage), bootstrap, prefix, signing_key_file)


@override_app.command("clear")
def override_clear(scope: Scope, reason: Reason, ttl: Ttl = "1d", by: By = None,
                   signing_key_file: SigningKeyFile = None,
                   bootstrap: Bootstrap = None, prefix: Prefix = None) -> None:
    """Lift the scope's override from the next period (a clear's TTL only says how long
    `override list` shows it)."""
    try:
        ttl_ms = parse_ttl(ttl)
    except ValueError as exc:
        fail(str(exc))
    _send(_make(scope=scope, action="clear", ttl_ms=ttl_ms, reason=reason,
                by=by or getpass.getuser()), bootstrap, prefix, signing_key_file)


@override_app.command("list")
def override_list(
    scope: Annotated[str | None, typer.Option("--scope", help="Only this region.")] = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
) -> None:
    """The latest override of each scope, active or not, one line each."""
    from schemas.clock import wall_ms
    from streams.control.override import active, describe

    settings = kafka_settings(bootstrap, prefix)
    try:
        found, bad = read_all(settings)
    except Exception as exc:  # librdkafka and decode errors alike: one line, exit 1
        fail(f"cannot read {settings.topic('overrides')}: {exc}")
    now = wall_ms()
    shown = [o for o in found if scope is None or o.scope == scope]
    for o in shown:
        state = "active" if active(o, now) else ("cleared" if o.action == "clear" else "lapsed")
        typer.echo(f"{state:8} {describe(o, utc)}")
    for line in bad:
        typer.echo(f"invalid  {line}", err=True)
    if not shown:
        typer.echo("no overrides" + (f" for {scope}" if scope else ""))
