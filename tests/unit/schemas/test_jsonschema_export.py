"""The exported JSON Schema files are what the structs generate (no drift)."""

from __future__ import annotations

from schemas.export import SCHEMA_DIR, render


def test_committed_json_schema_matches_the_structs() -> None:
    for name, text in render().items():
        path = SCHEMA_DIR / name
        assert path.exists(), f"{name} missing: run python -m schemas.export"
        assert path.read_text() == text, f"{name} drifted: run python -m schemas.export"
