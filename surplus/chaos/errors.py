"""The one way a chaos run fails that is not an invariant violation."""

from __future__ import annotations


class ChaosError(RuntimeError):
    """The run could not be set up or kept going (not an invariant violation)."""
