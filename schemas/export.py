"""Export the contract as JSON Schema files under `schemas/jsonschema/` (one per event type).

Run `python -m schemas.export` after changing `schemas/contract.py`; a test fails while the
committed files differ from what the structs generate.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec

from schemas.events import EVENT_TYPES

SCHEMA_DIR = Path(__file__).resolve().parent / "jsonschema"


def render() -> dict[str, str]:
    """File name -> file text for every event type, deterministic."""
    files = {}
    for event_type in EVENT_TYPES:
        schema = msgspec.json.schema(event_type)
        schema["$id"] = f"https://surplus.dev/schemas/{event_type.__name__}.json"
        schema["title"] = event_type.__name__
        files[f"{event_type.__name__}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return files


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    SCHEMA_DIR.mkdir(exist_ok=True)
    stale = []
    for name, text in render().items():
        path = SCHEMA_DIR / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"JSON Schema out of date: {', '.join(stale)} (run python -m schemas.export)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
