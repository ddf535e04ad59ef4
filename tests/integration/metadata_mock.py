"""amazon-ec2-metadata-mock (AEMM), AWS's simulator of the EC2 instance metadata service, run on
127.0.0.1 for the capacity agent's tests: spot interruptions, rebalance recommendations and the
IMDSv2 token flow, as the real service answers them. `make ec2-metadata-mock` builds it."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from surplus import localkafka
from surplus.live.procs import Child
from tests.go_tools import built, start_answering

START_TIMEOUT_S = 20.0


def binary() -> Path:
    return built("ec2-metadata-mock", "ec2-metadata-mock",
                 "github.com/aws/amazon-ec2-metadata-mock")


class MetadataMock:
    """One AEMM ``spot`` server, IMDSv2 only (``-I``): reads without a token get 401.

    ``args`` are the spot command's flags, e.g. ``["-a", "terminate", "-t", "<RFC 3339>",
    "-d", "3", "--rebalance-delay-sec", "0"]``. Start with ``start()``, always ``stop()``.
    """

    def __init__(self, log_dir: Path, args: list[str], port: int | None = None,
                 name: str = "aemm") -> None:
        self.port = port or localkafka.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.child = Child(name, ["spot", "-I", "-n", "127.0.0.1", "-p", str(self.port),
                                  *args], log_dir, program=[str(binary())])

    def start(self) -> MetadataMock:
        def token() -> None:
            request = urllib.request.Request(
                f"{self.url}/latest/api/token", method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
            with urllib.request.urlopen(request, timeout=2):
                pass

        start_answering(self.child, token, START_TIMEOUT_S)
        return self

    def stop(self) -> None:
        self.child.stop(timeout_s=5.0)
