"""What is listening on this machine, read from the kernel's socket tables (Linux)."""

from __future__ import annotations

import ipaddress
from pathlib import Path


def listening() -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket, IPv4 and IPv6."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            host_hex, port_hex = fields[1].split(":")
            raw = bytes.fromhex(host_hex)  # 32-bit words in host (little-endian) order
            host = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((str(ipaddress.ip_address(host)), int(port_hex, 16)))
    return found
