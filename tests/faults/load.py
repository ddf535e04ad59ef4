"""Open-loop ranking load, from `surplus.fleet.load` (shared with `surplus chaos`)."""

from surplus.fleet.load import LoadRunner, Window
from surplus.fleet.records import Request

__all__ = ["LoadRunner", "Request", "Window"]
