"""Hypothesis strategies for hostile input: arbitrary bytes, arbitrary JSON, valid documents
with one field replaced, removed or added, and pathological shapes (deep nesting, huge)."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import strategies as st

JSON_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40))
JSON = st.recursive(JSON_SCALARS,
                    lambda inner: st.lists(inner, max_size=6)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=6),
                    max_leaves=40)


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON document (keys and list indices)."""
    found: list[tuple[Any, ...]] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            found.append((*prefix, key))
            found += paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:4]):
            found.append((*prefix, i))
            found += paths(value, (*prefix, i))
    return found


def _set(doc: Any, path: tuple[Any, ...], value: Any, delete: bool) -> None:
    node = doc
    for part in path[:-1]:
        node = node[part]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value


@st.composite
def mutated(draw: st.DrawFn, valid: Any) -> tuple[bytes, tuple[Any, ...], str]:
    """`valid` (a struct) as JSON with one change: (payload, path changed, what was done)."""
    doc = msgspec.to_builtins(valid)
    where = paths(doc)
    path = draw(st.sampled_from(where))
    action = draw(st.sampled_from(["replace", "delete", "add_key"]))
    if action == "add_key":
        target = path[:-1]
        node = doc
        for part in target:
            node = node[part]
        if isinstance(node, dict):
            node[draw(st.text(min_size=1, max_size=10))] = draw(JSON)
        else:
            action = "replace"
    if action != "add_key":
        _set(doc, path, draw(JSON), delete=action == "delete")
    return msgspec.json.encode(doc), path, action


def nested(depth: int, opener: bytes = b"[") -> bytes:
    closer = b"]" if opener == b"[" else b"}"
    if opener == b"{":
        return b'{"a":' * depth + b"1" + closer * depth
    return opener * depth + closer * depth


HOSTILE_BYTES = st.binary(max_size=300) | JSON.map(msgspec.json.encode)
