"""The pure step of key rotation: one re-read, its ring swapped whole, a broken one logged once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from schemas.keywatch import KeyReloader
from schemas.signing import ACTIVE_FILE, KeySource


def test_a_reloader_swaps_a_rotation_in_and_logs_a_broken_directory_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "k1").write_text("old-secret")
    source = KeySource(tmp_path)
    reloader = KeyReloader(source)
    assert not reloader.poll()
    (tmp_path / "k2").write_text("new-secret")
    (tmp_path / ACTIVE_FILE).write_text("k2")
    with caplog.at_level(logging.WARNING, logger="surplus.keys"):
        assert reloader.poll()
    assert source.ring.signing_id == "k2"
    assert "new-secret" not in caplog.text              # key ids only, never the keys
    caplog.clear()
    (tmp_path / ACTIVE_FILE).write_text("k7")           # a typo mid-rotation
    with caplog.at_level(logging.ERROR, logger="surplus.keys"):
        assert not reloader.poll()
        assert not reloader.poll()
    assert len(caplog.records) == 1 and "k7" in caplog.text
    assert source.ring.signing_id == "k2"               # the ring held stays in use
    (tmp_path / ACTIVE_FILE).write_text("k1")
    assert reloader.poll() and source.ring.signing_id == "k1"
