"""Ports for local brokers and tests: free now, and below the kernel's ephemeral range, so
that no client's outgoing connection takes one before its listener binds it."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from surplus.localkafka.jvm import BrokerError

# Ports picked for tests start here (below the ephemeral range, above the common services).
PRIVATE_PORT_LOW = 20000

_given: set[int] = set()
"""Ports this process has handed out. A port is free until its listener binds it, and a fleet
picks its workers', proxies' and metrics ports before starting any of them: one CI run gave a
worker a port another listener of the same run had been given and bound first ("address
already in use"). So a port is handed out once per process (until most of the range has been)."""


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_low() -> int:
    """The first port the kernel hands out as a client's source port (32768 where unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free now, below the ephemeral range (for tests that need a broker of their own).

    A port the OS picks with ``bind(0)`` is an ephemeral one, and any client's outgoing
    connection may be given it as its source port before the broker binds it (a node then
    fails to start with "Address already in use"); below the range only a listener can take it.
    """
    return free_port_block(1)


def free_ports(count: int) -> list[int]:
    """``count`` different ports, each free now, below the ephemeral range. ``free_port``
    already gives a port once per process (``_given``); the check here keeps the list distinct
    whatever picks them."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def free_port_block(count: int, attempts: int = 200) -> int:
    """The first of ``count`` consecutive ports free now, below the ephemeral range."""
    high = _ephemeral_low() - count
    if len(_given) > (high - PRIVATE_PORT_LOW) // 2:
        _given.clear()
    for _ in range(attempts):
        base = random.randrange(PRIVATE_PORT_LOW, high)
        block = range(base, base + count)
        if not _given.intersection(block) and all(port_free(port) for port in block):
            _given.update(block)
            return base
    raise BrokerError(f"no {count} consecutive free ports on 127.0.0.1 in "
                      f"{PRIVATE_PORT_LOW}-{high + count}")
