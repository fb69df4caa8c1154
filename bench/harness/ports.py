"""Free loopback ports for children that need a fixed one (`kvgate serve --port`, engines
restarted on the same address)."""

from __future__ import annotations

import random
import socket

PORT_LOW, PORT_HIGH = 20_000, 32_000  # below the ephemeral range (32768+)


class NoFreePorts(RuntimeError):
    pass


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port_block(count: int, rng: random.Random, *, attempts: int = 50) -> int:
    """A base port such that `base .. base+count-1` are free on loopback right now."""
    for _ in range(attempts):
        base = rng.randrange(PORT_LOW, PORT_HIGH - count)
        if all(port_is_free(base + i) for i in range(count)):
            return base
    raise NoFreePorts(f"no {count} consecutive free ports found in {PORT_LOW}..{PORT_HIGH}")


def choose_port(preferred: int) -> int:
    """`preferred` when it is free (0: any free port), else 0 (any free port)."""
    if preferred and port_is_free(preferred):
        return preferred
    return 0
