"""Free loopback ports for hermetic servers."""

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago.

    The port is released before returning, so another process can take it
    first; callers that start an external binary on it should retry on
    "address already in use". Servers we own bind port 0 directly instead.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
