"""Every type on the wire, in one tuple: what codecs are built for, schemas exported and
hostile inputs tried on. The control loop's types are in `schemas.contract`, each lever's
beyond them in a module of its own (`schemas.precompute`)."""

from __future__ import annotations

from schemas.contract import CONTROL_TYPES, Event
from schemas.precompute import PRECOMPUTE_TYPES

EVENT_TYPES: tuple[type[Event], ...] = CONTROL_TYPES + PRECOMPUTE_TYPES
