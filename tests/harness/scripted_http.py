"""An HTTP endpoint whose answers a test scripts: what an exporter's retries and error handling
are tested against."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple


def serve_http(handler: type[BaseHTTPRequestHandler], poll_interval: float = 0.5) -> ThreadingHTTPServer:
    """A threading HTTP server on 127.0.0.1:0 running `handler` from a daemon thread; `stop_http` ends it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": poll_interval}, daemon=True).start()
    return server


def stop_http(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


class Received(NamedTuple):
    time_s: float  # monotonic
    headers: dict[str, str]
    body: bytes
    client_port: int


class ScriptedReceiver:
    """A remote-write endpoint on 127.0.0.1:0 answering each POST with the next
    ``(status, headers, body)`` of ``script``, then 204. ``hold`` blocks handlers until set."""

    def __init__(self, script: list[tuple[int, dict[str, str], bytes]] | None = None) -> None:
        self.script = list(script or [])
        self.received: list[Received] = []
        self.hold = threading.Event()
        self.hold.set()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.received.append(Received(time.monotonic(), dict(self.headers), body,
                                                      self.client_address[1]))
                    status, headers, answer = receiver.script.pop(0) if receiver.script else (204, {}, b"")
                receiver.hold.wait(10)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = serve_http(Handler, poll_interval=0.02)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/write"  # any path is answered

    def close(self) -> None:
        self.hold.set()
        stop_http(self.server)
