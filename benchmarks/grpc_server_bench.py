"""gRPC server implementations for the collector's OTLP/gRPC receiver: CPU per request (issue 38).

Each installed candidate serves the OTLP MetricsService ``Export`` RPC in its own child process
(this file with ``--serve CANDIDATE``), with two handlers on raw request bytes, as the receiver
registers them:
- ``decode``: the receiver's work: `MetricStore.ingest` of the request (one store per process,
  every server's series created in a warm-up), answered with `export_response`;
- ``empty``: an empty ExportMetricsServiceResponse, nothing decoded: the transport's own cost
  (served as ``otel_llm.bench.EmptyService/Export``, the same message types).
This process drives each over a grpcio channel with real OTLP exports (`collector_bench.server_export`,
one server's export per request, or `--batch` merged exports per request in ``decode_batched``),
1 or `--inflight` requests in flight, and reads the server process's CPU (/proc utime+stime).

Candidates: ``otel_llm_h2`` (what the receiver runs: `collector/receiver/grpc_h2.py`, HTTP/2 on
one asyncio thread), ``grpcio_sync`` (grpcio's server on a 4-thread pool, the receiver's before),
``grpcio_aio`` (grpcio's asyncio server), ``grpclib`` (pure-Python asyncio gRPC over h2) and
``grpclib_uvloop`` (the same on uvloop's event loop); one not installed is reported as skipped.

The machine is shared and noisy, so the candidates run alternately: each round runs every
workload on every candidate back to back (the order rotated per round), and `ratio_vs_grpcio_sync`
is the median over rounds of the ratio within the round.

Prints one JSON object: per candidate and workload (``{handler}_c{inflight}``) the requests sent,
the server's CPU seconds, µs of server CPU per request and data points per server CPU-second
(medians over rounds), and the ranking on ``decode_c1`` (single exports, the receiver's case).
Target (issue 10): >= 200,000 points per CPU-second over gRPC.

Usage: python benchmarks/grpc_server_bench.py [--quick] [--servers 16] [--seconds 2] [--rounds 3]
       [--candidates NAME ...]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from contextlib import ExitStack
from pathlib import Path
from typing import NamedTuple

METRICS_EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
EMPTY_EXPORT = "/otel_llm.bench.EmptyService/Export"
CANDIDATES = {  # name -> the modules it needs
    "otel_llm_h2": ("hpack",),
    "grpcio_sync": ("grpc",),
    "grpcio_aio": ("grpc",),
    "grpclib": ("grpclib",),
    "grpclib_uvloop": ("grpclib", "uvloop"),
}
BASELINE = "grpcio_sync"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # the receiver's default
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- the server side (child process) ---------------------------------------------------------------

def _handlers():
    """(decode, empty): request bytes -> ExportMetricsServiceResponse, as the receiver's sink answers."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

    from otel_llm.collector.exporter.prometheus.metric_store import MetricStore
    from otel_llm.collector.receiver.otlp_http import ROUTES, PartialSuccess, export_response

    store, route = MetricStore(), ROUTES["/v1/metrics"]

    def decode(payload: bytes):
        result = store.ingest(payload)
        return export_response(route, PartialSuccess(result.refused, result.reason) if result.refused else None)

    def empty(payload: bytes):
        return ExportMetricsServiceResponse()

    return decode, empty


def _serialize(message) -> bytes:
    return message.SerializeToString()


def _announce(port: int) -> None:
    print(port, flush=True)


def _serve_grpcio_sync() -> None:
    from concurrent import futures

    import grpc

    decode, empty = _handlers()
    server = grpc.server(futures.ThreadPoolExecutor(4), options=[("grpc.max_receive_message_length",
                                                                  MAX_MESSAGE_BYTES)])
    for path, fn in ((METRICS_EXPORT, decode), (EMPTY_EXPORT, empty)):
        service, method = path[1:].split("/")
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {
            method: grpc.unary_unary_rpc_method_handler(lambda payload, context, fn=fn: fn(payload),
                                                        response_serializer=_serialize)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    _announce(port)
    server.wait_for_termination()


async def _serve_grpcio_aio() -> None:
    import grpc

    decode, empty = _handlers()
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
    for path, fn in ((METRICS_EXPORT, decode), (EMPTY_EXPORT, empty)):
        async def call(payload, context, fn=fn):
            return fn(payload)

        service, method = path[1:].split("/")
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {
            method: grpc.unary_unary_rpc_method_handler(call, response_serializer=_serialize)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    _announce(port)
    await server.wait_for_termination()


async def _serve_grpclib() -> None:
    from grpclib.const import Cardinality, Handler
    from grpclib.encoding.base import CodecBase
    from grpclib.server import Server

    class RawCodec(CodecBase):
        """Requests stay bytes (the sink parses them once); responses are protobuf messages."""

        __content_subtype__ = "proto"

        def encode(self, message, message_type) -> bytes:
            return message.SerializeToString()

        def decode(self, data: bytes, message_type) -> bytes:
            return data

    def unary(fn):
        async def call(stream) -> None:
            await stream.send_message(fn(await stream.recv_message()))

        return Handler(call, Cardinality.UNARY_UNARY, bytes, object)

    decode, empty = _handlers()

    class Servable:
        def __mapping__(self):
            return {METRICS_EXPORT: unary(decode), EMPTY_EXPORT: unary(empty)}

    server = Server([Servable()], codec=RawCodec())
    await server.start("127.0.0.1", 0)
    _announce(server._server.sockets[0].getsockname()[1])
    await server.wait_closed()


def _serve_otel_llm_h2() -> None:
    from otel_llm.collector.receiver.grpc_h2 import UnaryServer

    decode, empty = _handlers()
    server = UnaryServer({METRICS_EXPORT: lambda payload: decode(payload).SerializeToString(),
                          EMPTY_EXPORT: lambda payload: empty(payload).SerializeToString()},
                         max_message_bytes=MAX_MESSAGE_BYTES)
    _announce(server.start())
    threading.Event().wait()


def serve(candidate: str) -> None:
    """Serves until killed; prints the bound port on stdout once listening."""
    import asyncio

    if candidate == "grpcio_sync":
        _serve_grpcio_sync()
    elif candidate == "otel_llm_h2":
        _serve_otel_llm_h2()
    elif candidate == "grpcio_aio":
        asyncio.run(_serve_grpcio_aio())
    elif candidate == "grpclib":
        asyncio.run(_serve_grpclib())
    elif candidate == "grpclib_uvloop":
        import uvloop

        uvloop.run(_serve_grpclib())
    else:
        raise ValueError(f"unknown candidate {candidate!r}; one of {sorted(CANDIDATES)}")


# -- the driver (this process) ---------------------------------------------------------------------

class Workload(NamedTuple):
    handler: str  # "decode" or "empty"
    batched: bool  # `--batch` exports per request instead of one
    inflight: int

    @property
    def name(self) -> str:
        return f"{self.handler}{'_batched' if self.batched else ''}_c{self.inflight}"


class Run(NamedTuple):
    requests: int
    points: int
    cpu_s: float


class ServerProcess:
    """One candidate's server in a child process; its CPU seconds from /proc."""

    def __init__(self, candidate: str) -> None:
        self.candidate = candidate

    def __enter__(self) -> ServerProcess:
        import grpc

        self.proc = subprocess.Popen([sys.executable, __file__, "--serve", self.candidate],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.proc.kill()
            raise RuntimeError(f"{self.candidate} server did not start: {line!r}")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{int(line)}")
        self.rpcs = {path: self.channel.unary_unary(path, request_serializer=None, response_deserializer=None)
                     for path in (METRICS_EXPORT, EMPTY_EXPORT)}
        return self

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK

    def __exit__(self, *exc) -> None:
        self.channel.close()
        self.proc.kill()
        self.proc.wait(timeout=10)


def send(rpc, bodies: list[tuple[bytes, int]], inflight: int, until) -> tuple[int, int]:
    """(requests, points) sent with `inflight` in flight until `until()` is true, every answer awaited."""
    requests = points = 0
    pending: deque = deque()  # (future, points)
    for body, num in itertools.cycle(bodies):
        if until():
            break
        if inflight == 1:
            rpc(body, timeout=30)
            requests, points = requests + 1, points + num
            continue
        pending.append((rpc.future(body, timeout=30), num))
        while len(pending) >= inflight or (pending and pending[0][0].done()):
            future, num = pending.popleft()
            future.result()
            requests, points = requests + 1, points + num
    for future, num in pending:
        future.result()
        requests, points = requests + 1, points + num
    return requests, points


def measure(server: ServerProcess, workload: Workload, bodies: list[tuple[bytes, int]], seconds: float) -> Run:
    """Sends for `seconds`, and on until the server used at least 5 clock ticks of CPU (a quick run's floor)."""
    rpc = server.rpcs[METRICS_EXPORT if workload.handler == "decode" else EMPTY_EXPORT]
    before, deadline = server.cpu_s(), time.monotonic() + seconds
    give_up = deadline + 10
    requests, points = send(rpc, bodies, workload.inflight, lambda: time.monotonic() >= give_up or (
        time.monotonic() >= deadline and server.cpu_s() - before >= 5 / _CLK_TCK))
    return Run(requests, points, server.cpu_s() - before)


def summarize(runs: list[Run], baseline: list[Run] | None) -> dict:
    rates = [r.points / r.cpu_s for r in runs]
    out = {"requests": sum(r.requests for r in runs), "cpu_s": round(sum(r.cpu_s for r in runs), 2),
           "cpu_us_per_request": round(statistics.median(1e6 * r.cpu_s / r.requests for r in runs), 1),
           "points_per_cpu_s": round(statistics.median(rates))}
    if baseline is not None:
        out["ratio_vs_grpcio_sync"] = round(statistics.median(
            rate / (b.points / b.cpu_s) for rate, b in zip(rates, baseline)), 2)
    return out


def version(candidate: str) -> str:
    module = CANDIDATES[candidate][0]  # the distribution that does the work (ours: its HPACK decoder's)
    return importlib.metadata.version({"grpc": "grpcio"}.get(module, module))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test, not a measurement)")
    parser.add_argument("--servers", type=int, default=16, help="distinct server exports the client cycles through")
    parser.add_argument("--batch", type=int, default=10, help="server exports per request in decode_batched")
    parser.add_argument("--inflight", type=int, default=8, help="requests in flight in the concurrent runs")
    parser.add_argument("--seconds", type=float, default=2.0, help="sending time per workload, candidate and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--candidates", nargs="+", choices=sorted(CANDIDATES), default=sorted(CANDIDATES),
                        help="the servers to measure (default: every installed one)")
    parser.add_argument("--serve", choices=sorted(CANDIDATES), help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from collector_bench import merged, num_points, server_export

    servers, seconds, rounds = (4, 0.3, 1) if args.quick else (args.servers, args.seconds, args.rounds)
    batch = min(args.batch, servers)
    exports = [server_export(i) for i in range(servers)]
    single = [(e.SerializeToString(), num_points(e)) for e in exports]
    grouped = [(merged(exports[i:i + batch]).SerializeToString(), sum(num_points(e) for e in exports[i:i + batch]))
               for i in range(0, servers, batch)]
    workloads = [Workload("empty", False, 1), Workload("empty", False, args.inflight),
                 Workload("decode", False, 1), Workload("decode", False, args.inflight),
                 Workload("decode", True, 1)]
    installed = [c for c, modules in CANDIDATES.items()
                 if c in args.candidates and all(importlib.util.find_spec(m) for m in modules)]
    result = {"points_per_export": single[0][1], "export_bytes": len(single[0][0]), "servers": servers,
              "batch": batch, "inflight": args.inflight, "rounds": rounds, "seconds": seconds,
              "cpu_clock_ticks_per_s": _CLK_TCK, "candidates": {}}
    runs: dict[str, dict[str, list[Run]]] = {c: {w.name: [] for w in workloads} for c in installed}
    with ExitStack() as stack:
        procs = {c: stack.enter_context(ServerProcess(c)) for c in installed}
        for server in procs.values():  # warm up: every series created, connections and caches made
            send(server.rpcs[METRICS_EXPORT], single + grouped, 1, _after(0.2))
            send(server.rpcs[EMPTY_EXPORT], single, args.inflight, _after(0.1))
        for r in range(rounds):
            order = installed[r % len(installed):] + installed[:r % len(installed)]
            for workload in workloads:
                for candidate in order:
                    run = measure(procs[candidate], workload, grouped if workload.batched else single, seconds)
                    runs[candidate][workload.name].append(run)
                    print(f"round {r + 1}/{rounds} {workload.name:17} {candidate:15} "
                          f"{run.points / run.cpu_s:>9,.0f} points/cpu-s", file=sys.stderr)
    for candidate in args.candidates:
        if candidate not in installed:
            result["candidates"][candidate] = {"skipped": "not installed"}
            continue
        baseline = runs.get(BASELINE)
        result["candidates"][candidate] = {"version": version(candidate), "runs": {
            w.name: summarize(runs[candidate][w.name], baseline[w.name] if baseline else None) for w in workloads}}
    measured = {c: v["runs"] for c, v in result["candidates"].items() if "runs" in v}
    result["ranking"] = sorted(measured, key=lambda c: -measured[c]["decode_c1"]["points_per_cpu_s"])
    best = result["ranking"][0]
    result["targets_met"] = {
        "best_decode_c1_200k_points_per_cpu_s": measured[best]["decode_c1"]["points_per_cpu_s"] >= 200_000,
        "best_decode_c1_1_5x_grpcio_sync": measured[best]["decode_c1"].get("ratio_vs_grpcio_sync", 0) >= 1.5,
    }
    print(json.dumps(result, indent=1))
    return 0


def _after(seconds: float):
    deadline = time.monotonic() + seconds
    return lambda: time.monotonic() >= deadline


if __name__ == "__main__":
    sys.exit(main())
