"""Options and helpers shared by the `surplus` subcommand modules."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from pydantic import ValidationError

from schemas.kafka_config import KafkaSettings

if TYPE_CHECKING:
    from schemas.signing import KeySource

# The Kafka flags read the variables KafkaSettings reads, whatever the command: one name each.
Bootstrap = Annotated[str | None, typer.Option(
    "--bootstrap", "-b", envvar="SURPLUS_KAFKA_BOOTSTRAP",
    help="Kafka bootstrap servers (default: 127.0.0.1:9092)")]
Prefix = Annotated[str | None, typer.Option("--prefix", envvar="SURPLUS_KAFKA_PREFIX",
                                            help="Topic name prefix.")]
MetricsPort = Annotated[int, typer.Option(help="Prometheus port (0 = off).")]
MetricsHost = Annotated[str, typer.Option(
    help="Address the metrics endpoint binds (0.0.0.0 exposes it beyond this host).")]
SigningKeyFile = Annotated[Path | None, typer.Option(
    help="Sign what this command issues with the keyring in this key file (its key is "
         "`default`) or key directory (a file per key id, `active` naming the signing one; "
         "re-read while it runs). See docs/security.md.")]


def fail(reason: str) -> NoReturn:
    """One line on stderr, exit status 1."""
    typer.echo(f"error: {reason}", err=True)
    raise typer.Exit(1)


def preflight(settings: KafkaSettings, timeout_s: float) -> None:
    """Stop now, in one line, when the cluster refuses these settings (bad credentials or
    TLS); only warn when it does not answer yet (it may come up after us)."""
    from surplus.kafka_check import KafkaAccessError, check

    try:
        result = check(settings, timeout_s=timeout_s)
    except KafkaAccessError as exc:
        fail(str(exc))
    if result.outcome == "unreachable":
        typer.echo(f"warning: Kafka at {settings.bootstrap} did not answer within "
                   f"{timeout_s:.0f}s; carrying on (it is retried in the background)", err=True)


def kafka_settings(bootstrap: str | None = None, prefix: str | None = None) -> KafkaSettings:
    """Settings from the environment, overridden by flags; bad config names the key and exits."""
    overrides: dict[str, Any] = {k: v for k, v in {"bootstrap": bootstrap,
                                                   "prefix": prefix}.items() if v}
    try:
        return KafkaSettings(**overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "settings"
        fail(f"bad Kafka setting {key}: {err['msg']}")


def signing_keys(path: Path | None, reload_s: float | None = None) -> KeySource | None:
    """The keyring at ``path`` (None: signing off), re-read every ``reload_s`` seconds (None:
    the default, 0: never) by a daemon thread; an unreadable one exits naming the flag."""
    if path is None:
        return None
    from schemas.signing import KeySource
    from workers.runtime import keywatch

    try:
        keys = KeySource(path)
    except ValueError as exc:
        fail(f"--signing-key-file: {exc}")
    every = keywatch.RELOAD_EVERY_S if reload_s is None else reload_s
    if every > 0:
        keywatch.watch(keys, every)
    return keys
