"""A fleet connecting at once: N simultaneous OTLP/HTTP connections to an `otel-llm collector`.

Starts the collector in its own process (its default connection settings unless flags say
otherwise), then opens `--connections` connections at the same instant from this process
(asyncio, one coroutine each), each POSTing one server's metric export (every family of the
vllm profile: 57 data points, 28 KB), and times each from its connect to the end of the answer.

Prints one JSON object: the answers by outcome (200, 503 with Retry-After, or the client-side
error: a connect timeout, a reset), the wait percentiles and the maximum, and the collector's
own counts (connections refused, points accepted). Target (issue 31): every connection answered,
200 or 503 + Retry-After, none waiting more than 3 s.

Usage: python benchmarks/connection_burst.py [--connections 1000] [--timeout 30] [-- collector flags]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.collector_bench import CollectorProcess, server_export  # noqa: E402


async def post_once(port: int, request: bytes, timeout_s: float) -> tuple[str, float]:
    """(outcome, seconds): "200", "503+Retry-After", another status, or the error's name."""
    start = time.monotonic()
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout_s)
        writer.write(request)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s - (time.monotonic() - start))
        lines = head.decode("latin-1").split("\r\n")
        status = lines[0].split()[1]
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", 0))),
                               timeout_s - (time.monotonic() - start))
        outcome = "503+Retry-After" if status == "503" and "retry-after" in headers else status
    except (TimeoutError, asyncio.TimeoutError):
        outcome = "client_timeout"
    except (OSError, asyncio.IncompleteReadError) as exc:
        outcome = type(exc).__name__
    finally:
        if writer is not None:
            writer.close()
    return outcome, time.monotonic() - start


async def burst(port: int, body: bytes, connections: int, timeout_s: float) -> list[tuple[str, float]]:
    request = (b"POST /v1/metrics HTTP/1.1\r\nHost: collector\r\nContent-Type: application/x-protobuf\r\n"
               b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    return await asyncio.gather(*(post_once(port, request, timeout_s) for _ in range(connections)))


def percentile(values: list[float], q: float) -> float:
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1], 3) if len(values) > 1 else values[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=30.0, help="the clients' timeout, seconds")
    parser.add_argument("collector_flags", nargs="*", help="passed to otel-llm collector (after --)")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, max(soft, 2 * args.connections + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))  # this process's, and the collector's
    body = server_export(0).SerializeToString()
    with CollectorProcess(*args.collector_flags) as collector:
        asyncio.run(burst(collector.http_port, body, 2, args.timeout))  # warm up: series created
        before = collector.accepted()
        results = asyncio.run(burst(collector.http_port, body, args.connections, args.timeout))
        accepted = collector.accepted() - before
        refused = collector.counter("otel_llm_collector_connections_closed", 'reason="refused"')
    waits = sorted(seconds for _, seconds in results)
    outcomes: dict[str, int] = {}
    for outcome, _ in results:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    answered = outcomes.get("200", 0) + outcomes.get("503+Retry-After", 0)
    result = {
        "connections": args.connections, "collector_flags": args.collector_flags, "outcomes": outcomes,
        "wait_s": {"p50": percentile(waits, 50), "p90": percentile(waits, 90), "p99": percentile(waits, 99),
                   "max": round(waits[-1], 3)},
        "over_1s": sum(w > 1 for w in waits), "over_3s": sum(w > 3 for w in waits),
        "collector": {"points_accepted": int(accepted), "connections_refused": int(refused)},
        "targets_met": {"all_answered_200_or_503": answered == args.connections, "none_over_3s": waits[-1] <= 3},
    }
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
