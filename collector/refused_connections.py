"""Connections a listener refuses: answered, drained, closed, by one thread for all of them.

Threads: `refuse` is called from the accepting thread; one thread of its own reads and closes.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time

_BUSY_TEXT = b"too many connections; retry in 1s\n"
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_TEXT), _BUSY_TEXT))
_LINGER_S = 2.0  # how long a refused connection is read from before it is closed
_MAX_LINGERING = 4096


class RefusedConnections:
    """Answers each connection it is given 503 + ``Retry-After: 1``, then reads what the client
    sends until it closes or `_LINGER_S` passes, then closes it: closing a socket with unread
    data sends a reset, which can reach the client before the answer does."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="http-lingering", daemon=True)
        self._thread.start()

    def refuse(self, sock: socket.socket) -> None:
        try:
            sock.setblocking(False)
            sock.send(_BUSY)
            sock.shutdown(socket.SHUT_WR)
            with self._lock:
                if len(self._selector.get_map()) < _MAX_LINGERING:
                    self._selector.register(sock, selectors.EVENT_READ, time.monotonic() + _LINGER_S)
                    return
        except OSError:
            pass
        sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                idle = not self._selector.get_map()
            if idle:
                self._stop.wait(0.05)
                continue
            ready = {key.fileobj for key, _ in self._selector.select(0.05)}
            now = time.monotonic()
            with self._lock:
                for key in list(self._selector.get_map().values()):
                    if key.fileobj in ready and self._drained(key.fileobj) or key.data < now:
                        self._selector.unregister(key.fileobj)
                        key.fileobj.close()

    @staticmethod
    def _drained(sock: socket.socket) -> bool:
        try:
            return not sock.recv(64 * 1024)
        except BlockingIOError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        with self._lock:
            for key in list(self._selector.get_map().values()):
                key.fileobj.close()
            self._selector.close()
