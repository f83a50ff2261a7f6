"""`stop_retries(exporter)`: from now on a failed export of an SDK OTLP exporter is not retried.

The SDK's OTLP exporters retry a failed export (connection refused, 503, UNAVAILABLE) with an
exponential back-off (1, 2, 4 s, ...) until their timeout (`OTEL_EXPORTER_OTLP_TIMEOUT`, 10 s), and
only the exporter's `shutdown()` cuts a back-off short; the SDK's readers and span processors call
it after their last export. So a process that stops while its endpoint refuses connections waits
out the whole back-off (8 s) for a batch that will not be delivered. The Collector's exporters stop
retrying once shutdown begins (exporterhelper's retry sender); ours do the same: the counting
reader and span processor (`otlp_metrics`, `otlp_traces`) call `stop_retries` as their shutdown
begins, so the last export is one attempt (within the exporter's timeout: a working endpoint still
gets the last batch), and a failure ends it at once.

The signal is the SDK's own "shutdown in progress" event, private state: `_client._shutdown_event`
of the OTLP/HTTP exporters (opentelemetry-exporter-otlp-proto-http 1.4x), `_shutdown_in_progress` of
the gRPC ones and of earlier HTTP ones. Where neither is found nothing changes (the back-off then
still ends within the server's --shutdown-timeout) and `stop_retries` returns False.
"""

from __future__ import annotations

import threading


def stop_retries(exporter) -> bool:
    """Set `exporter`'s shutdown-in-progress event (an SDK OTLP metric or span exporter); True if found."""
    for holder, name in ((getattr(exporter, "_client", None), "_shutdown_event"), (exporter, "_shutdown_in_progress")):
        event = getattr(holder, name, None)
        if isinstance(event, threading.Event):
            event.set()
            return True
    return False
