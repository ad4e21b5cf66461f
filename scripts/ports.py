"""A free port on 127.0.0.1 for a server about to start, as testkit's free_port picks
one (crates/testkit/src/net.rs): at random below the kernel's ephemeral range, never
in it, where an outgoing connection could take it before the server binds it; never
one it gave before (a server and its admin listener once got the same port)."""

import random
import socket

GIVEN: set[int] = set()


def free_port() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            highest = int(f.read().split()[0]) - 1
    except (OSError, ValueError, IndexError):
        highest = 32_767
    for _ in range(1_000 if highest > 10_000 else 0):
        if (port := random.randint(10_000, highest)) in GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        GIVEN.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        GIVEN.add(port := s.getsockname()[1])
        return port
