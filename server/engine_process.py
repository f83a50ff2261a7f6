"""The engine loop: owns one `LLMEngine`, talks to the API process over one pipe.

`run_engine` runs either as the target of a spawned process (`engine_main`, the
default topology) or in a thread of the API process (`--in-process`); the wire is
the same `Connection` and the same flat-bytes messages (`otel_llm.server.ipc`) either way.

Loop, single-threaded, owns the engine:
    1. drain at most `max_recv_per_iter` commands (block only when idle), so a
       burst of arrivals cannot starve decode (SGLang's `max_recv_per_poll`);
    2. one `engine.step()`; its outputs and telemetry bytes go out as one STEP
       message (nothing sent for an empty step);
    3. a HEARTBEAT when nothing was sent for `HEARTBEAT_INTERVAL_S`: the API side's
       watchdog takes an engine it has not heard from for its deadline as hung.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING

from otel_llm.server import ipc

if TYPE_CHECKING:
    from otel_llm.server.engine.config import EngineConfig

logger = logging.getLogger(__name__)

_IDLE_POLL_S = 0.5  # how long an idle loop blocks on the pipe before re-checking
HEARTBEAT_INTERVAL_S = 1.0


def cap_threads(num_threads: int) -> None:
    """Cap torch/OpenMP/MKL pools so API and engine processes do not oversubscribe
    the cores. `torch.set_num_threads` caps torch even when it is already imported;
    the env vars cap libraries loaded later and the processes this one spawns."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(num_threads)
    import torch

    torch.set_num_threads(num_threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work already started in this process
        pass


def engine_main(conn: Connection, config: EngineConfig, max_recv_per_iter: int) -> None:
    """Entry point of the spawned engine process; `config.num_threads` must be set."""
    # Ctrl-C reaches the whole process group, and so does a SIGTERM sent to it (`timeout`, systemd's
    # default KillMode); the API process shuts the engine down with a SHUTDOWN command (or the engine
    # sees EOF when the API process is gone), so it drains instead of dying under the API process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s engine %(name)s: %(message)s")
    cap_threads(config.num_threads)
    run_engine(conn, config, max_recv_per_iter)


def run_engine(conn: Connection, config: EngineConfig, max_recv_per_iter: int) -> None:
    """Build the engine, send READY (or FATAL), then serve until SHUTDOWN or EOF.
    Closes `conn` on the way out, so the API side's reader sees EOF."""
    try:
        _run(conn, config, max_recv_per_iter)
    finally:
        conn.close()


def _run(conn: Connection, config: EngineConfig, max_recv_per_iter: int) -> None:
    try:
        from otel_llm.server.engine.llm_engine import LLMEngine

        engine = LLMEngine(config)
    except BaseException as exc:
        if isinstance(exc, ValueError):
            logger.error("engine failed to start: %s", exc)
        else:
            logger.exception("engine failed to start")
        _send_quietly(conn, ipc.encode_fatal(f"engine failed to start: {type(exc).__name__}: {exc}",
                                             config_error=isinstance(exc, ValueError)))
        return
    conn.send_bytes(ipc.encode_ready(engine.model_name, engine.max_model_len, os.getpid()))
    try:
        _loop(conn, engine, max_recv_per_iter)
    except (EOFError, BrokenPipeError, ConnectionResetError):
        logger.info("API side closed the pipe; engine loop exits")
    except BaseException as exc:
        logger.exception("engine loop died")
        _send_quietly(conn, ipc.encode_fatal(f"engine loop died: {type(exc).__name__}: {exc}"))


def _loop(conn: Connection, engine, max_recv_per_iter: int) -> None:
    from otel_llm.server.engine.sampling import SamplingParams

    last_sent = time.monotonic()
    while True:
        now = time.monotonic()
        if now - last_sent >= HEARTBEAT_INTERVAL_S:
            conn.send_bytes(ipc.HEARTBEAT_BYTES)
            last_sent = now
        busy = engine.has_unfinished()
        for _ in range(max_recv_per_iter):
            if not conn.poll(0 if busy else _IDLE_POLL_S):
                break
            cmd = ipc.decode_command(conn.recv_bytes())
            if isinstance(cmd, ipc.Shutdown):
                return
            if isinstance(cmd, ipc.AbortRequest):
                engine.abort(cmd.rid)
            else:
                try:
                    params = SamplingParams(
                        temperature=cmd.temperature, top_p=cmd.top_p, top_k=cmd.top_k, seed=cmd.seed,
                        max_tokens=cmd.max_tokens, stop=cmd.stop, stop_token_ids=cmd.stop_token_ids,
                        ignore_eos=cmd.ignore_eos, n=cmd.n,
                    )
                    engine.add_request(cmd.rid, list(cmd.prompt_token_ids), params)
                except ValueError as exc:
                    conn.send_bytes(ipc.encode_reject(cmd.rid, str(exc)))
                    last_sent = time.monotonic()
            busy = True  # a command arrived: drain without blocking, then step
        if not engine.has_unfinished():
            continue
        out = engine.step()
        if out.outputs or out.telemetry:
            conn.send_bytes(ipc.encode_step(out.outputs, out.telemetry))
            last_sent = time.monotonic()


def engine_pids(api_pid: int) -> list[int]:
    """The engine processes `api_pid` spawned (Linux `/proc`; empty elsewhere and with
    `--in-process`), for tools that measure or signal the engine: `/health` shows no pids."""
    pids = []
    for task in Path(f"/proc/{api_pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            try:
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    pids.append(child)
            except OSError:
                pass
    return sorted(pids)


def _send_quietly(conn: Connection, data: bytes) -> None:
    try:
        conn.send_bytes(data)
    except OSError:
        pass
