"""`surplus override`: what the command refuses before anything reaches Kafka."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from surplus.cli import app
from surplus.override_cmd import parse_ttl

runner = CliRunner()
NOWHERE = ["--bootstrap", "127.0.0.1:1"]  # nothing may be sent: every case fails first


@pytest.mark.parametrize(("text", "ms"), [("90s", 90_000), ("30m", 1_800_000), ("2h", 7_200_000),
                                          ("1d", 86_400_000), ("45", 45_000), ("1.5h", 5_400_000),
                                          ("500ms", 500)])
def test_ttl_takes_a_number_with_a_unit(text: str, ms: int) -> None:
    assert parse_ttl(text) == ms


@pytest.mark.parametrize("text", ["", "soon", "0s", "-5m", "31d", "5y"])
def test_a_ttl_that_is_not_a_positive_duration_of_at_most_30_days_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--ttl"):
        parse_ttl(text)


@pytest.mark.parametrize(("args", "says"), [
    (["set", "--scope", "eu1", "--kill"], "Missing option '--reason'"),
    (["set", "--scope", "eu1", "--kill", "--reason", "  "], "`reason` is blank"),
    (["set", "--scope", "eu1", "--reason", "why"], "needs one of `kill`"),
    (["set", "--scope", "eu1", "--kill", "--reason", "why", "--ttl", "forever"], "--ttl"),
    (["set", "--scope", "eu1", "--max-coverage", "1.5", "--reason", "why"], "--max-coverage"),
    (["clear", "--scope", "eu1"], "Missing option '--reason'"),
])
def test_a_bad_override_is_refused_by_the_command_naming_what_is_wrong(args: list[str],
                                                                       says: str) -> None:
    result = runner.invoke(app, ["override", *args, *NOWHERE])
    assert result.exit_code != 0
    assert says in result.output, result.output
