"""The EC2 instance metadata service (IMDS), read with the IMDSv2 session-token flow.

IMDSv2: ``PUT /latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` returns a
token; every read carries it in ``X-aws-ec2-metadata-token``. The token is kept until shortly
before its TTL and fetched again on a 401 (the service restarted, or the token expired early),
as AWS's node-termination-handler does. There is no IMDSv1 fallback: instances that require
IMDSv2 (the default on new AMIs) refuse v1 reads, and a token works everywhere.

A path that does not exist *now* answers 404 — that is how the service says "no interruption
scheduled" — so ``get`` returns None for it. Anything else that is not a document (refused
connection, timeout, 5xx, a token refused twice) raises ``ImdsError`` with what happened, for
the agent to log and poll again.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable

TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
DEFAULT_ENDPOINT = "http://169.254.169.254"
MAX_BODY = 64 << 10


class ImdsError(RuntimeError):
    """The metadata service could not be read; the message says where and why."""


class Imds:
    """A small IMDSv2 client (stdlib HTTP: the agent reads two paths every few seconds)."""

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, *, token_ttl_s: int = 21_600,
                 timeout_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 1 <= token_ttl_s <= 21_600:
            raise ValueError("token_ttl_s must be 1 to 21600 (IMDS's bounds)")
        self.endpoint = endpoint.rstrip("/")
        self.token_ttl_s = token_ttl_s
        self.timeout_s = timeout_s
        self.clock = clock
        self._token: str | None = None
        self._token_until = 0.0
        self.tokens_fetched = 0

    def get(self, path: str) -> bytes | None:
        """The document at ``path``, or None when the service says it does not exist (404)."""
        for attempt in (1, 2):
            token = self._current_token()
            request = urllib.request.Request(f"{self.endpoint}{path}",
                                             headers={TOKEN_HEADER: token})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                    return bytes(resp.read(MAX_BODY))
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 1:
                    self._token = None  # expired or unknown to a restarted service: once more
                    continue
                raise ImdsError(f"metadata service at {self.endpoint} answered {path} with "
                                f"HTTP {exc.code} {exc.reason}") from None
            except (urllib.error.URLError, OSError) as exc:
                raise ImdsError(f"metadata service at {self.endpoint} unreachable reading "
                                f"{path}: {_why(exc)}") from None
        raise AssertionError("unreachable")

    def _current_token(self) -> str:
        now = self.clock()
        if self._token is not None and now < self._token_until:
            return self._token
        request = urllib.request.Request(f"{self.endpoint}{TOKEN_PATH}", method="PUT",
                                         headers={TTL_HEADER: str(self.token_ttl_s)})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                token = resp.read(MAX_BODY).decode("ascii", errors="replace").strip()
        except urllib.error.HTTPError as exc:
            raise ImdsError(f"metadata service at {self.endpoint} refused an IMDSv2 token "
                            f"(PUT {TOKEN_PATH}): HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ImdsError(f"metadata service at {self.endpoint} unreachable asking for an "
                            f"IMDSv2 token: {_why(exc)}") from None
        if not token:
            raise ImdsError(f"metadata service at {self.endpoint} gave an empty IMDSv2 token")
        self._token = token
        # renewed well before the service expires it (a minute early, or at half a short TTL)
        self._token_until = now + max(self.token_ttl_s / 2, self.token_ttl_s - 60)
        self.tokens_fetched += 1
        return token


def _why(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason if reason is not None else exc) or type(exc).__name__
