"""HMAC signing of ControlTargets, for the receiving side (workers and clients).

The functions live in `schemas.signing`, the shared bottom layer, because the control plane
signs what it publishes and `streams` and `workers` never import each other. This module keeps
the receivers' import path.
"""

from schemas.signing import canonical_bytes, load_key, sign, signature_of, verifier

__all__ = ["canonical_bytes", "load_key", "sign", "signature_of", "verifier"]
