"""How Surplus processes write their logs: plain lines for a terminal, or one JSON object per
line (`surplus --log-format json`) for a log pipeline that should not parse free text.

The format travels in $SURPLUS_LOG_FORMAT, so the processes a command starts (the demo's, the
soak's) log as it does. python-json-logger writes the objects.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Literal, cast, get_args

LogFormat = Literal["text", "json"]
FORMATS: tuple[str, ...] = get_args(LogFormat)
ENV = "SURPLUS_LOG_FORMAT"
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The fields of each JSON line; anything passed in `extra=` is added to them.
JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s"
JSON_RENAME = {"asctime": "time", "levelname": "level", "name": "logger"}


def current() -> LogFormat:
    """The format this process was told to use ($SURPLUS_LOG_FORMAT; text when unset).

    Raises ValueError naming the variable for any other value: a typo must not silently turn
    a log pipeline's input back into free text."""
    value = os.environ.get(ENV, "text")
    if value not in FORMATS:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(FORMATS)}")
    return cast(LogFormat, value)


def select(fmt: LogFormat) -> None:
    """Use `fmt` here and in every process started from here."""
    os.environ[ENV] = fmt


def formatter_config(fmt: LogFormat) -> dict[str, Any]:
    """A logging.config formatter entry for `fmt`."""
    if fmt == "json":
        return {"()": "pythonjsonlogger.json.JsonFormatter", "fmt": JSON_FIELDS,
                "rename_fields": JSON_RENAME}
    return {"format": TEXT}


def configure(level: str | int = "WARNING") -> None:
    """Root logging in the selected format at `level` (replacing any handler set before)."""
    import logging.config

    logging.config.dictConfig(dict_config(level))


def dict_config(level: str | int) -> dict[str, Any]:
    """The whole logging.config dictionary: one stderr handler in the selected format. Faust's
    worker takes it as its `logging_config`, so its own lines come out in the same format."""
    level = level.upper() if isinstance(level, str) else logging.getLevelName(level)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"surplus": formatter_config(current())},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "surplus",
                                "stream": "ext://sys.stderr"}},
        "root": {"level": level, "handlers": ["stderr"]},
    }


def faust_options(level: str) -> dict[str, Any]:
    """Extra keyword arguments for Faust's Worker: in JSON, our logging config (Faust's own is
    coloured text on stdout, kept as it is for text)."""
    return {"logging_config": dict_config(level)} if current() == "json" else {}
