"""A uvicorn server in a thread of the test process, for tests of the server's HTTP protocol layer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn


@contextmanager
def serving(config: uvicorn.Config) -> Iterator[uvicorn.Server]:
    """Runs `config` until the block ends (it has started when the block begins, or 10 s passed)."""
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(timeout=10)
