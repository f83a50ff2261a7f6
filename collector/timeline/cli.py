"""`otel-llm timeline`: the request timeline of a time window, offline, from the collector's trace
store (``--trace-store DIR``) or an OTLP/JSON file (``--otlp-json FILE``, see `trace_file`).

Writes any of: the picture (``--out``, `timeline_plot`; PNG, or SVG/PDF by the extension) with
the data it draws beside it (``--data-out``, default the picture's name with ``.json``:
``{"t0_ns", "overview": the store's heatmap of every request of the window by ``--metric``
(`request_heat.heatmap`, its columns fitted to the requests), "rows": [TimelineRow as a dict], "load":
[LoadPoint as a dict], "lanes": [Lane.as_json()]}``,
times as JSON integers in ns since the epoch, the spans' own, except the lanes' µs), and the traces
as the JSON the Jaeger UI's "Upload JSON" opens (``--jaeger-json``: ``{"data": [trace]}``, each trace
as the query API's ``GET /api/traces/{id}`` gives it).

Under the rows, the picture draws the engine lane (`timeline.lanes`): the steps of the `engine steps`
window spans from the window's start to its end or the last row's end, whichever is later.

The window is ``--start``/``--end`` (ISO 8601; without a zone, local time) or ``--last 15m``; by
default everything. It holds the traces whose request span started in it, at most ``--limit``: when
there are more, the failed ones, the slowest and an even sample across it (the overview still counts
every one). Exit codes: 0 written; 1 the window holds no request (nothing is written); 2 a bad
flag or input (a missing store or file, a malformed file, bad times, no matplotlib), named on
stderr. Progress and a summary go to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sqlite3
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

from otel_llm.cli.arg_types import int_in, positive_int
from otel_llm.collector.cli import duration_s
from otel_llm.collector.tracestore.request_heat import METRICS

_PROGRESS_EVERY_S = 1.0
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _iso_time_us(text: str) -> int:
    try:
        return (datetime.fromisoformat(text).astimezone() - _EPOCH) // timedelta(microseconds=1)
    except (ValueError, OverflowError, OSError):
        raise argparse.ArgumentTypeError(f"invalid time {text!r}: use ISO 8601, e.g. 2025-06-01T12:00:00Z or "
                                         "2025-06-01 12:00 (local time)") from None


_iso_time_us.__name__ = "time"


def add_parsers(sub) -> None:
    p = sub.add_parser("timeline", help="draw the request timeline of a trace store or OTLP/JSON file; export "
                                        "its traces for the Jaeger UI",
                       description="One row per request (queue, prefill and decode spans, first token, preemptions, "
                                   "finish reason) over the running and waiting load, from the collector's "
                                   "--trace-store or an OTLP/JSON file (the OpenTelemetry Collector's file exporter). "
                                   "Exit 0: written; 1: no request in the window, nothing written; 2: bad input.")
    p.set_defaults(run=run, extras=())  # matplotlib (the `timeline` extra) only to draw: checked then
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace-store", metavar="DIR", help="the collector's --trace-store directory")
    source.add_argument("--otlp-json", metavar="FILE",
                        help="OTLP/JSON ExportTraceServiceRequests, one per line or one document; vLLM's llm_request "
                             "spans get derived phase spans, as in the collector")
    p.add_argument("--start", type=_iso_time_us, metavar="TIME", help="requests that started at or after this "
                   "(ISO 8601; local time without a zone)")
    p.add_argument("--end", type=_iso_time_us, metavar="TIME", help="... and at or before this")
    p.add_argument("--last", type=duration_s, metavar="DURATION", help="requests of the last DURATION (e.g. 15m) "
                   "instead of --start/--end")
    p.add_argument("--metric", choices=METRICS, default="ttft",
                   help="the overview's latency: ttft (default), e2e, queue or itl (mean inter-token latency)")
    p.add_argument("--limit", type=positive_int, default=1000, help="at most this many traces (default 1000); "
                   "beyond it, the failed ones, the slowest and an even sample")
    p.add_argument("--out", metavar="FILE", help="the picture: .png (default timeline.png unless only --jaeger-json "
                   "is given), .svg, .pdf")
    p.add_argument("--data-out", metavar="FILE", help="the rows and load drawn, as JSON (default: --out's name "
                   "with .json)")
    p.add_argument("--dpi", type=int_in(20, 600, "dpi"), default=100, help="the picture's resolution (default 100: 1400 px wide)")
    p.add_argument("--jaeger-json", metavar="FILE", help="write the window's traces as the JSON the Jaeger UI's "
                   "Upload JSON opens")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> int:
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font cache notices are not ours to show
    try:
        start_us, end_us = _window(args)
        out, data_out = _outputs(args)
        if out is not None:
            from otel_llm.collector.timeline import plot as timeline_plot

            timeline_plot.check_format(out)
    except ValueError as exc:
        return _fail(2, str(exc))
    except ImportError:
        return _fail(2, "drawing needs matplotlib: pip install 'otel-llm[timeline]' (or write only --jaeger-json)")

    from otel_llm.collector.timeline.lanes import timeline_lanes
    from otel_llm.collector.timeline.rows import load, rows_from_traces

    began = time.monotonic()
    try:
        with _opened(args) as (store, source):
            matched, traces, chosen = store.choose_requests(start_us, end_us, args.limit)
            if matched > args.limit:
                _say(f"the window holds {matched} requests, more than --limit {args.limit}: drawing {chosen} "
                     "(narrow it with --start/--end/--last, or raise --limit)")
            rows = rows_from_traces(traces)  # by start
            if not rows:
                return _fail(1, f"no request in {source} between {_when(start_us)} and {_when(end_us)}: "
                                "nothing written")
            last_end_us = (max(r.end_ns for r in rows) + 999) // 1000
            lanes = timeline_lanes(store, start_us, max(end_us, last_end_us))
            overview = store.heatmap(args.metric, start_us, end_us, fit=True)
    except (ValueError, OSError, sqlite3.Error) as exc:
        return _fail(2, str(exc))
    points = load(rows)
    _say(f"{len(rows)} requests ({sum(map(len, traces))} spans) from {source}, read in {time.monotonic() - began:.1f} s")
    steps = sum(len(lane.steps["end_ns"]) for lane in lanes)
    _say(f"{len(lanes)} engine lane{'s' * (len(lanes) != 1)} ({steps} steps)" if lanes else
         "no engine lane (no `engine steps` span) in the window")

    written = []
    try:
        if out is not None:
            _say(f"drawing {len(rows)} rows")
            timeline_plot.draw(rows, points, out, args.dpi, lanes, overview)
            data = {"t0_ns": rows[0].start_ns, "overview": overview, "rows": [r._asdict() for r in rows],
                    "load": [p._asdict() for p in points], "lanes": [lane.as_json() for lane in lanes]}
            _write_json(data_out, data)
            written += [out, data_out]
        if args.jaeger_json:
            from otel_llm.collector.extension.jaeger_query import trace_json

            _write_json(args.jaeger_json, {"data": [trace_json(spans) for spans in traces]})
            written.append(args.jaeger_json)
    except OSError as exc:
        return _fail(1, f"cannot write: {exc}")
    _say(f"wrote {', '.join(written)}")
    return 0


def _window(args) -> tuple[int, int]:
    if args.last is not None:
        if args.start is not None or args.end is not None:
            raise ValueError("--last replaces --start/--end: give one or the other")
        now_us = time.time_ns() // 1000
        return now_us - int(args.last * 1_000_000), now_us
    start_us = 0 if args.start is None else args.start
    end_us = (1 << 63) - 1 if args.end is None else args.end
    if start_us > end_us:
        raise ValueError(f"--start ({_when(start_us)}) is after --end ({_when(end_us)})")
    return start_us, end_us


def _outputs(args) -> tuple[str | None, str | None]:
    out = args.out if args.out or args.jaeger_json else "timeline.png"
    if args.data_out and not out:
        raise ValueError("--data-out is the data of the picture: give --out too")
    data_out = args.data_out or (None if out is None else str(Path(out).with_suffix(".json")))
    paths = [p for p in (out, data_out, args.jaeger_json) if p]
    if len(set(map(Path, paths))) != len(paths):
        raise ValueError(f"--out, --data-out and --jaeger-json must be different files, got {', '.join(paths)}")
    for path in paths:
        if not Path(path).absolute().parent.is_dir():
            raise ValueError(f"cannot write {path!r}: no directory {str(Path(path).absolute().parent)!r}")
    return out, data_out


@contextmanager
def _opened(args):
    """(the TraceStore to read, its source's name): the collector's --trace-store, or a temporary
    store holding the --otlp-json file as a collector would store it; closed (and removed) after."""
    if args.trace_store:
        if not (Path(args.trace_store) / "traces.sqlite").is_file():
            raise ValueError(f"no trace store in {args.trace_store!r} (no traces.sqlite): give the directory the "
                             "collector's --trace-store names")
        with _store(args.trace_store) as store:
            yield store, f"trace store {args.trace_store}"
    else:
        from otel_llm.collector.tracestore.otlp_file import load_traces

        if not Path(args.otlp_json).is_file():
            raise ValueError(f"no file {args.otlp_json!r}")
        last = [time.monotonic()]

        def progress(requests: int, spans: int) -> None:
            if time.monotonic() - last[0] >= _PROGRESS_EVERY_S:
                last[0] = time.monotonic()
                _say(f"read {requests} OTLP export requests ({spans} spans) from {args.otlp_json}")

        with tempfile.TemporaryDirectory(prefix="otel-llm-timeline-") as directory, _store(directory) as store:
            load_traces(args.otlp_json, store, progress)
            yield store, args.otlp_json


@contextmanager
def _store(directory: str):
    """The TraceStore in `directory`, closed after; ValueError when its file is not a trace store."""
    from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig

    try:
        store = TraceStore(TraceStoreConfig(directory))
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"{directory}/traces.sqlite is not a trace store: {exc}") from None
    try:
        yield store
    finally:
        store.close()


def _write_json(path: str, document: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(document, f, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _when(t_us: int) -> str:
    if t_us <= 0:
        return "the beginning"
    if t_us >= (1 << 63) - 1:
        return "the end"
    return datetime.fromtimestamp(t_us / 1e6).astimezone().isoformat(timespec="seconds")


def _say(text: str) -> None:
    print(f"otel-llm timeline: {text}", file=sys.stderr, flush=True)


def _fail(code: int, text: str) -> int:
    print(f"otel-llm timeline: {'error: ' if code == 2 else ''}{text}", file=sys.stderr)
    return code
