"""A free port on 127.0.0.1 for a server about to start, as testkit's
free_port picks one (crates/testkit/src/net.rs): at random below the kernel's
ephemeral range, never in it. Outgoing connections take their local ports
from that range, so a port of it, free when picked, can be taken before the
server binds it."""

from __future__ import annotations

import random
import socket

LOWEST = 10_000


def free_port() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            highest = int(f.read().split()[0]) - 1
    except (OSError, ValueError, IndexError):
        highest = 32_767
    for _ in range(1_000 if highest > LOWEST else 0):
        port = random.randint(LOWEST, highest)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
