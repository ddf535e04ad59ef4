"""`surplus --settings FILE`: one TOML file with a table per command, whose keys are that
command's options, e.g.::

    log_format = "json"

    [control-plane]
    metrics_port = 9101
    instance_id = "control-0"

    [worker]
    port = 8080
    metrics_host = "0.0.0.0"

    [kafka.up]
    port = 9092

It becomes Click's `default_map`, so every command takes its settings from flags, the
environment (`SURPLUS_CONTROL_*` for `control-plane`, `SURPLUS_WORKER_*` for `worker`,
`SURPLUS_<COMMAND>_*` for the others) and this file alike, in that order of precedence. Click
ignores keys it does not know; this module does not: a misspelt table or key stops the command
at start, naming it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Protocol


class CommandGroup(Protocol):
    """A Click group, as Typer's vendored Click builds it (`typer.main.get_group`)."""

    def make_context(self, info_name: str | None, args: list[str], **extra: Any) -> Any: ...
    def list_commands(self, ctx: Any) -> list[str]: ...
    def get_command(self, ctx: Any, cmd_name: str) -> Any: ...

#: Keys of the file's top level that are the root command's own options.
ROOT_KEYS = frozenset({"log_format"})


class SettingsFileError(ValueError):
    """The settings file cannot be used; the message names the file and the key."""


def load(path: Path, root: CommandGroup) -> dict[str, Any]:
    """The file as a `default_map` for `root`'s commands, every table and key checked."""
    try:
        tree = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsFileError(f"settings file {path}: {exc}") from exc
    top = {k: v for k, v in tree.items() if k in ROOT_KEYS}
    ctx = root.make_context("surplus", [], resilient_parsing=True)
    rest = {k: v for k, v in tree.items() if k not in ROOT_KEYS}
    return {**top, **_check(path, root, ctx, rest)}


def _check(path: Path, group: CommandGroup, ctx: Any, tree: dict[str, Any],
           where: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in tree.items():
        key = f"{where}{name}"
        command = group.get_command(ctx, name)
        if command is None or not isinstance(value, dict):
            known = ", ".join(sorted(group.list_commands(ctx)))
            raise SettingsFileError(f"settings file {path}: [{key}] is not a command (one of "
                                    f"{known}), or not a table")
        if hasattr(command, "list_commands"):     # a group: its tables are its commands
            out[name] = _check(path, command, ctx, value, f"{key}.")
            continue
        options = {p.name: p for p in command.params if p.name}
        table: dict[str, Any] = {}
        for option, setting in value.items():
            param_name = option.replace("-", "_")
            if param_name not in options:
                raise SettingsFileError(
                    f"settings file {path}: [{key}] {option} is not an option of "
                    f"`surplus {key.replace('.', ' ')}` (one of {', '.join(sorted(options))})")
            table[param_name] = setting
        out[name] = table
    return out
