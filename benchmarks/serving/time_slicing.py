"""Time-sliced loads: several servers, each with its load client, run in turn for a slice each."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import numpy as np

from benchmarks.serving import log
from benchmarks.serving.client import Result, StreamClient, run_requests
from benchmarks.serving.fidelity import deltas, counts, scrape
from benchmarks.serving.server_process import cpu_per_token, cpu_seconds, get_model
from benchmarks.serving.summary import summarize
from benchmarks.serving.workload import Req, make_prompt


def _client_main(conn, url: str, model: str, warm: list[Req], reqs: list[Req], concurrency: int,
                 ignore_eos: bool, label: str, audio: bool = False) -> None:
    """A load client in its own process, so that it can be paused with its server: warm-up
    (opens the pooled connections), "ready", wait for "go", run the load, send back
    (results, start, end)."""
    try:
        from uvloop import run
    except ImportError:
        run = asyncio.run

    async def main():
        client = StreamClient(url)
        await run_requests(client, model, warm, concurrency, ignore_eos, f"{label} warmup", audio)
        conn.send("ready")
        conn.recv()
        out = await run_requests(client, model, reqs, concurrency, ignore_eos, label, audio)
        await client.aclose()
        return out

    results, start, end = run(main())
    conn.send(([vars(r) for r in results], start, end))  # plain dicts: Result is this script's class


def running_clock(windows: list[tuple[float, float]]):
    """Maps perf_counter stamps to running time: the length of the `windows` (sorted,
    disjoint (start, end) slices in which a process ran) before each stamp."""
    starts = np.array([w[0] for w in windows])
    lengths = np.array([w[1] - w[0] for w in windows])
    before = np.concatenate(([0.0], np.cumsum(lengths)))

    def clock(stamps) -> np.ndarray:
        t = np.asarray(stamps, dtype=float)
        i = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, None)
        return before[i] + np.clip(t - starts[i], 0.0, lengths[i])

    return clock


class _Group:
    """The processes that run together in one time slice: a server's process group (API
    process and engine), its load client and, for the telemetry-on server, the receiver."""

    def __init__(self, pgid: int, pids: list[int]):
        self.pgid, self.pids = pgid, pids

    def signal(self, sig: int) -> None:
        """Signals every process that is still there (one that died is reported by its load)."""
        for kill, target in ((os.killpg, self.pgid), *((os.kill, pid) for pid in self.pids)):
            try:
                kill(target, sig)
            except ProcessLookupError:
                pass


def time_sliced(servers: dict, reqs: list[Req], args, label: str, receiver_pid: int | None) -> dict[str, dict]:
    """Runs the same load against every server at once, time-sliced: one server (with its
    client) runs for `--slice` seconds while the others are stopped (SIGSTOP), in turn,
    until every load is done. On a shared VM the machine's speed moves by +-20% from one
    second to the next; slicing makes that noise hit every server alike. Client stamps are
    mapped to their server's running time (`running_clock`), so throughput, TTFT, ITL and
    e2e are those of a server that ran alone. Per server: the load summary, its CPU use per
    token, and (for servers with metrics) whether /metrics counted exactly what the client got.
    With `args.audio` (if present) the load asks for audio output (`otel-llm serve-pipeline`)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    model = get_model(next(iter(servers.values())).url, args.model_name)
    warm = [Req(0.0, make_prompt(args.prompt_len, 10_000 + i), args.max_tokens) for i in range(args.concurrency)]
    conns, procs, groups = {}, {}, {}
    for mode, srv in servers.items():
        conns[mode], child = ctx.Pipe()
        procs[mode] = ctx.Process(target=_client_main, daemon=True, args=(
            child, srv.url, model, warm, reqs, args.concurrency, args.ignore_eos, f"{label} {mode}",
            getattr(args, "audio", False)))
        procs[mode].start()
    for mode, srv in servers.items():
        if conns[mode].recv() != "ready":
            raise RuntimeError(f"the {mode} client did not start")
        extra = [receiver_pid] if mode == "on" and receiver_pid else []
        groups[mode] = _Group(srv.proc.pid, [procs[mode].pid, *extra])
    with httpx.Client(timeout=30.0) as http:
        before = {m: scrape(http, srv.url) for m, srv in servers.items()}
    cpu_before = {m: cpu_seconds(srv.pids) for m, srv in servers.items()}
    windows: dict[str, list] = {m: [] for m in servers}
    outcome: dict[str, tuple] = {}
    try:
        for group in groups.values():
            group.signal(signal.SIGSTOP)
        for conn in conns.values():
            conn.send("go")  # read by each client when it first runs
        deadline = time.monotonic() + args.load_timeout * len(servers)
        while len(outcome) < len(servers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{label}: the loads of {sorted(set(servers) - set(outcome))} did not finish "
                                   f"within --load-timeout {args.load_timeout} s of running time each")
            for mode, group in groups.items():
                if mode in outcome:
                    continue
                t0 = time.perf_counter()
                group.signal(signal.SIGCONT)
                if conns[mode].poll(args.slice):
                    try:
                        outcome[mode] = conns[mode].recv()
                    except EOFError:
                        raise RuntimeError(f"{label}: the {mode} load client died") from None
                group.signal(signal.SIGSTOP)
                windows[mode].append((t0, time.perf_counter()))
    finally:
        for group in groups.values():
            group.signal(signal.SIGCONT)
    out = {}
    with httpx.Client(timeout=30.0) as http:
        for mode, srv in servers.items():
            results, start, end = outcome[mode]
            load = summarize([Result(**r) for r in results], start, end, running_clock(windows[mode]))
            load["server_cpu"] = cpu_per_token(cpu_before[mode], cpu_seconds(srv.pids), load)
            load["slices"] = len(windows[mode])
            d = deltas(before[mode], scrape(http, srv.url))
            load["counts"] = d and counts(d, load)
            log(f"{label} {mode}: {load['completed']}/{load['requests']} ok, "
                f"{load['output_token_throughput']:.0f} tok/s over {load['wall_s']:.2f} s of running time")
            out[mode] = load
    for proc in procs.values():
        proc.join(timeout=10)
    return out
