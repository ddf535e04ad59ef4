"""Go programs the tests run for real, from `surplus.fleet.tools` (shared with `surplus chaos`)."""

from surplus.fleet.tools import ROOT, ToolError, built, start_answering

__all__ = ["ROOT", "ToolError", "built", "start_answering"]
