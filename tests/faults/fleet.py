"""The fault suite's fleet, from `surplus.fleet.fleet` (shared with `surplus chaos`)."""

from surplus.fleet.fleet import Fleet, figures_of

__all__ = ["Fleet", "figures_of"]
