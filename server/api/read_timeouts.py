"""Header and body read timeouts for `otel-llm serve`, as nginx's `client_header_timeout` and
`client_body_timeout`.

uvicorn closes a connection only when it idles after a response (its keep-alive timeout): a client
that opens a socket and sends nothing, trickles its headers a byte at a time, or declares a body
and stops sending it holds the connection for as long as it likes. `timed_protocol(base, timeouts)`
subclasses uvicorn's HTTP protocol with two deadlines per connection:

    header  from the connection's accept (or, on a kept-alive connection, from the first byte of
            its next request) until the request's headers are complete: `--header-timeout`;
    body    from the end of the headers until the body's last byte: `--body-timeout`, for the
            whole body (a body trickled a byte a second is cut too; the default 60 s takes the
            default 4 MiB `--max-request-bytes` at 70 KB/s).

When one passes the connection is closed, without an answer (as nginx does), and counted
(`ReadTimeouts.counts`, `otel_llm_http_read_timeouts_total{phase}` on /metrics). A request's
handler waiting for the body sees the client disconnect. A deadline that passes while the server
itself is not reading (uvicorn's flow control: a pipelined request waits for the one before it, or
the app has not taken the body it buffered) starts again: only the client's delay counts.

The hooks are the httptools parser's callbacks: uvicorn's httptools protocol, which the serve
extra installs (`uvicorn[standard]`). With uvicorn's h11 protocol there are no read timeouts, and
`timed_protocol` logs a warning saying so.

Thread-safety: the timers and counts belong to the event-loop thread.
"""

from __future__ import annotations

import logging

from otel_llm.canonical.instruments import Kind
from otel_llm.export.exposition import SelfFamily

logger = logging.getLogger(__name__)

PHASES = ("header", "body")


class ReadTimeouts:
    """The two deadlines (seconds) and how many connections each closed."""

    def __init__(self, header_s: float, body_s: float):
        self.seconds = {"header": header_s, "body": body_s}
        self.counts = dict.fromkeys(PHASES, 0)

    def family(self) -> SelfFamily:
        return SelfFamily("otel_llm_http_read_timeouts", Kind.COUNTER,
                          "Connections closed because a request's headers (--header-timeout) or body "
                          "(--body-timeout) did not arrive in time.",
                          tuple((f'phase="{phase}"', count) for phase, count in self.counts.items()))


def timed_protocol(base: type, timeouts: ReadTimeouts) -> type:
    """`base` (a uvicorn httptools protocol class, e.g. `arrival.stamping_protocol()`) with the read
    timeouts; an h11 `base` is returned as it is, with a warning."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        HttpToolsProtocol = None
    if HttpToolsProtocol is None or not issubclass(base, HttpToolsProtocol):
        logger.warning("httptools is not installed: no --header-timeout / --body-timeout (uvicorn's h11 "
                       "protocol has no hook for them); install uvicorn[standard]")
        return base

    class TimedProtocol(base):
        _read_timer = None  # asyncio.TimerHandle of the deadline running, if one is

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm("header")  # an idle socket's deadline too

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._read_timer is None:  # a later request on a kept-alive connection
                self._arm("header")

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()
            self._arm("body")  # httptools calls on_message_complete next when there is no body

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def _arm(self, phase: str) -> None:
            self._read_timer = self.loop.call_later(timeouts.seconds[phase], self._deadline_passed, phase)

        def _disarm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def _deadline_passed(self, phase: str) -> None:
            self._read_timer = None
            if self.transport.is_closing() or self.transport.get_protocol() is not self:  # closed, or upgraded
                return
            if self.flow.read_paused:  # the server is not reading: not the client's delay
                self._arm(phase)
                return
            timeouts.counts[phase] += 1
            logger.debug("closing %s: request %s not received within %g s", self.client, phase,
                         timeouts.seconds[phase])
            self.transport.close()

    return TimedProtocol
