"""Open-loop ranking load, from `surplus.fleet.load` (shared with `surplus chaos`)."""

from surplus.fleet.load import LoadRunner, Sample, Window

__all__ = ["LoadRunner", "Sample", "Window"]
