"""toxiproxy, from `surplus.fleet.toxiproxy` (shared with `surplus chaos`)."""

from surplus.fleet.toxiproxy import Toxiproxy, ToxiproxyError, binary

__all__ = ["Toxiproxy", "ToxiproxyError", "binary"]
