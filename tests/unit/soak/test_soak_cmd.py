"""`surplus soak` refuses what cannot be a soak, in one line, before starting anything."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from surplus.cli import app


@pytest.mark.parametrize(("args", "says"), [
    (["--minutes", "0.5"], "--minutes must be at least 1"),
    (["--minutes", "2", "--warmup", "120"], "--warmup must be within the run"),
    (["--minutes", "2", "--bound", "0"], "must be > 0"),
])
def test_a_run_that_cannot_be_judged_is_refused(args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["soak", *args])
    assert result.exit_code == 1
    assert says in result.output
