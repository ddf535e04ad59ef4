"""toxiproxy (github.com/Shopify/toxiproxy/v2), the real TCP proxy, driven over its HTTP API.

A fault test (or `surplus chaos`) puts one proxy between Kafka, or a worker, and everything
that talks to it and then makes the network slow (latency with jitter, a bandwidth limit) or
broken (a black hole, a cut) while load runs. The server is the binary `make toxiproxy`
builds with Go into `.tools/` (the version is pinned in the Makefile); what can find or build
neither fails, saying so, since a network fault that does not run is one that cannot fail.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from surplus import localkafka
from surplus.fleet.tools import ToolError, built, start_answering
from surplus.live.procs import Child

START_TIMEOUT_S = 20.0


class ToxiproxyError(AssertionError):
    """The proxy could not be built, started or driven; the message says why."""


def binary() -> Path:
    """The server binary, built by `make toxiproxy` first when it is missing."""
    try:
        return built("toxiproxy-server", "toxiproxy", "github.com/Shopify/toxiproxy/v2")
    except ToolError as exc:
        raise ToxiproxyError(str(exc)) from exc


class Toxiproxy:
    """One toxiproxy server on a free loopback port, its proxies and toxics set over HTTP.

    Start with `start()`, always `stop()`: the server runs in a session of its own and dies
    with the test process, so no proxy outlives a run.
    """

    def __init__(self, log_dir: Path) -> None:
        self.port = localkafka.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.child = Child("toxiproxy", ["-host", "127.0.0.1", "-port", str(self.port),
                                         "-proxy-metrics", "-seed", "7"], log_dir,
                           program=[str(binary())])

    def start(self) -> Toxiproxy:
        try:
            start_answering(self.child, lambda: self._call("GET", "/proxies"), START_TIMEOUT_S)
        except ToolError as exc:
            raise ToxiproxyError(str(exc)) from exc
        return self

    def stop(self) -> None:
        self.child.stop(timeout_s=5.0)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                raw = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise ToxiproxyError(f"toxiproxy {method} {path}: {exc.code} "
                                 f"{exc.read().decode()[:300]}") from exc
        return json.loads(raw) if raw.strip() else None

    def proxy(self, name: str, listen_port: int, upstream_port: int) -> None:
        """A proxy from 127.0.0.1:``listen_port`` to 127.0.0.1:``upstream_port``."""
        self._call("POST", "/proxies", {"name": name, "listen": f"127.0.0.1:{listen_port}",
                                        "upstream": f"127.0.0.1:{upstream_port}"})

    def set_upstream(self, name: str, upstream_port: int) -> None:
        """Point proxy ``name`` at 127.0.0.1:``upstream_port`` (a process restarted on a new
        port keeps its address behind the proxy)."""
        self._call("POST", f"/proxies/{name}", {"upstream": f"127.0.0.1:{upstream_port}"})

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Disabled, the proxy closes every connection and refuses new ones (a cut)."""
        self._call("POST", f"/proxies/{name}", {"enabled": enabled})

    def add_toxic(self, proxy: str, toxic: str, kind: str, stream: str,
                  **attributes: float) -> None:
        """Toxic ``kind`` on one direction of every connection, present and future:
        ``downstream`` is broker to client, ``upstream`` client to broker."""
        self._call("POST", f"/proxies/{proxy}/toxics",
                   {"name": toxic, "type": kind, "stream": stream, "attributes": attributes})

    def add_both_ways(self, proxy: str, kind: str, **attributes: float) -> None:
        """The same toxic on both directions, named ``<kind>_up`` and ``<kind>_down``."""
        for stream in ("upstream", "downstream"):
            self.add_toxic(proxy, f"{kind}_{stream.removesuffix('stream')}", kind, stream,
                           **attributes)

    def clear(self, proxy: str) -> None:
        """Every toxic of ``proxy`` removed and the proxy enabled: the network healed."""
        for toxic in self._call("GET", f"/proxies/{proxy}/toxics"):
            self._call("DELETE", f"/proxies/{proxy}/toxics/{toxic['name']}")
        self.set_enabled(proxy, True)
