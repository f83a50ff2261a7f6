"""`otel-llm timeline`: a real server's requests (preempted and aborted ones among them) through the
collector into its trace store, drawn offline: the picture is a real PNG of the promised size in
the timeline's colours, its data is the stored spans' own timestamps, one row per request span,
and the Jaeger JSON is what the query API answers and what the Jaeger UI's upload accepts. An
OTLP/JSON file of vLLM's spans gets the collector's derived phases. The engine lane's window spans
come out as the steps put in, drawn under the rows in a taller picture. Bad inputs: exit code and
message."""

from __future__ import annotations

import base64
import json
import os
import signal
import struct
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import numpy as np
import pytest
from google.protobuf import json_format
from opentelemetry.proto.trace.v1 import trace_pb2

from otel_llm.cli import main
from otel_llm.collector.extension.jaeger_query import trace_json
from otel_llm.collector.processor.phase_spans import PhaseSpans
from otel_llm.collector.service import Collector, CollectorConfig
from otel_llm.collector.timeline.plot import MAX_LANES, PHASE_COLOURS, PREEMPTION_COLOUR, figure_size_in
from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig
from otel_llm.engine.step import ForwardSource
from otel_llm.export.lane_spans import LANE_SPAN, lane_attributes
from otel_llm.server.engine_process import engine_pids
from tests.collector.processor.test_phase_spans import vllm_request, vllm_spans
from tests.collector.tracestore.test_store import INTERNAL, T0_NS, kvs, llm_spans, sid, tid
from tests.collector.tracestore.test_store import request as trace_request
from tests.server.api.api_server_harness import REPO, ServerProcess, sample, wait_until

PHASES = ("queue", "prefill", "decode")


def timeline(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otel_llm", "timeline", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def png_colours(path: Path) -> set[tuple[int, int, int]]:
    from matplotlib.image import imread

    pixels = (imread(path)[..., :3] * 255).round().astype(np.uint8).reshape(-1, 3)
    return set(map(tuple, np.unique(pixels, axis=0).tolist()))


def rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(bytes.fromhex(hex_colour.lstrip("#")))


def assert_jaeger_ui_trace(trace: dict) -> None:
    """The uimodel shape the query API answers, and what the Jaeger UI's upload checks
    (readJsonFile's validateSingleTrace)."""
    assert set(trace) == {"traceID", "spans", "processes", "warnings"} and trace["traceID"]
    assert isinstance(trace["processes"], dict) and trace["processes"]
    for process in trace["processes"].values():
        assert set(process) == {"serviceName", "tags"} and process["serviceName"]
    for span in trace["spans"]:
        assert set(span) == {"traceID", "spanID", "operationName", "references", "startTime", "duration", "tags", "logs",
                             "processID", "warnings"}
        assert span["traceID"] == trace["traceID"] and span["spanID"] and span["operationName"]
        assert isinstance(span["startTime"], int) and isinstance(span["duration"], int)
        assert span["processID"] in trace["processes"]


def expected_rows(traces) -> list[dict]:
    """The rows the spans call for, read straight off them (ns)."""
    rows = []
    for spans in traces:
        for stored in spans:
            span = stored.span
            attrs = {kv.key: kv.value for kv in span.attributes}
            if not any(k.startswith("gen_ai.latency.") for k in attrs):
                continue
            children = {s.span.name: s.span for s in spans if s.span.parent_span_id == span.span_id}
            events = [(e.name, e.time_unix_nano) for e in span.events]
            if "prefill" in children:
                events += [(e.name, e.time_unix_nano) for e in children["prefill"].events]
            finish = attrs["error.type"].string_value if "error.type" in attrs else (
                attrs["gen_ai.response.finish_reasons"].array_value.values[0].string_value
                if "gen_ai.response.finish_reasons" in attrs else None)
            rows.append({
                "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(), "name": span.name,
                "start_ns": span.start_time_unix_nano, "end_ns": span.end_time_unix_nano,
                **{p: [children[p].start_time_unix_nano, children[p].end_time_unix_nano] if p in children else None
                   for p in PHASES},
                "first_token_ns": next((t for name, t in events if name == "first_token"), None),
                "preemptions_ns": sorted(t for name, t in events if name == "preempted"),
                "finish_reason": finish})
    return sorted(rows, key=lambda r: (r["start_ns"], r["trace_id"]))


def assert_load_counts_the_rows(data: dict) -> None:
    """Each load point: the rows in queue, and in prefill or decode, at its time (spans are [start, end))."""
    assert data["load"][-1] == {"t_ns": data["load"][-1]["t_ns"], "waiting": 0, "running": 0}
    for point in data["load"]:
        t = point["t_ns"]

        def inside(row, phase):
            return row[phase] is not None and row[phase][0] <= t < row[phase][1]
        assert point["waiting"] == sum(inside(r, "queue") for r in data["rows"])
        assert point["running"] == sum(inside(r, "prefill") or inside(r, "decode") for r in data["rows"])


@pytest.mark.slow
def test_a_real_servers_requests_from_the_trace_store(tmp_path):
    store_dir = tmp_path / "traces"
    config = CollectorConfig(otlp_http_port=0, otlp_grpc_port=None, prometheus_port=0, jaeger_port=0,
                             trace_store=TraceStoreConfig(str(store_dir)))
    with Collector(config) as collector:
        api = collector.jaeger.url
        # 20 blocks of 4 tokens, 11 blocks a request: concurrent requests preempt each other
        server = ServerProcess("--otlp-traces-endpoint", f"{collector.http.endpoint}/v1/traces", "--num-kv-blocks", "20",
                               "--block-size", "4", "--max-model-len", "80",
                               env={"OTEL_BSP_SCHEDULE_DELAY": "100"}).start()
        try:
            # Alone on the engine: its first token, then the engine is held and the client goes away; the
            # server aborts it before the engine makes another step. (With other requests running, the
            # engine can run far enough ahead of this process reading its stream to finish it first.)
            [engine] = engine_pids(server.proc.pid)
            with httpx.stream("POST", f"{server.url}/v1/completions", timeout=30, json={
                    "model": "dummy", "prompt": "long", "max_tokens": 70, "ignore_eos": True, "stream": True}) as r:
                next(r.iter_lines())
                os.kill(engine, signal.SIGSTOP)
            try:
                assert wait_until(lambda: server.health().json()["in_flight"] == 0)  # the abort is on its way
            finally:
                os.kill(engine, signal.SIGCONT)
            assert wait_until(lambda: sample(server.metrics(), "vllm:request_success_total", finished_reason="abort"))

            def complete(i: int) -> None:
                httpx.post(f"{server.url}/v1/completions", timeout=60, json={
                    "model": "dummy", "prompt": f"p{i}", "max_tokens": 40, "ignore_eos": True}).raise_for_status()
            threads = [threading.Thread(target=complete, args=(i,)) for i in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            preemptions = sample(server.metrics(), "vllm:num_preemptions_total")
        finally:
            server.stop()  # flushes its spans
        assert preemptions > 0
        assert wait_until(lambda: len(httpx.get(f"{api}/api/llm/slowest", params={"metric": "e2e"}).json()["data"]) == 7,
                          timeout_s=20)

        out, jaeger = tmp_path / "timeline.png", tmp_path / "upload.json"
        done = timeline("--trace-store", str(store_dir), "--out", str(out), "--jaeger-json", str(jaeger), "--dpi", "80")
        assert done.returncode == 0, done.stderr
        assert "7 requests" in done.stderr and done.stdout == ""

        store = TraceStore(TraceStoreConfig(str(store_dir)))
        try:
            traces = store.request_traces(0, (1 << 63) - 1)
        finally:
            store.close()
        data = json.loads((tmp_path / "timeline.json").read_text())
        want = expected_rows(traces)
        assert len(want) == 7
        assert [{k: row[k] for k in want[0]} for row in data["rows"]] == want
        assert data["t0_ns"] == want[0]["start_ns"]
        assert sum(len(r["preemptions_ns"]) for r in want) == preemptions
        assert [r["finish_reason"] for r in want].count("abort") == 1
        assert all(r[p] is not None for r in want for p in PHASES)
        assert_load_counts_the_rows(data)

        # the server's engine lane, drawn under the rows: its steps, the preemptions among them
        assert "1 engine lane (" in done.stderr
        [lane] = data["lanes"]
        assert {r["instance"] for r in data["rows"]} == {lane["instance"]} and lane["model"] == "dummy"
        assert sum(lane["preemptions"]) == preemptions
        assert lane["end_us"] == sorted(lane["end_us"])
        for r in data["rows"]:  # its prompt computed in a step of its prefill or decode
            assert any(r["prefill"][0] <= end_us * 1000 <= r["decode"][1]
                       for end_us, tokens in zip(lane["end_us"], lane["prefill_tokens"]) if tokens)
        width_in, height_in = figure_size_in(7, 1)
        assert png_size(out) == (round(width_in * 80), round(height_in * 80))
        colours = png_colours(out)
        assert len(colours) > 50  # antialiased text and lines
        assert {rgb(c) for c in (*PHASE_COLOURS.values(), PREEMPTION_COLOUR)} | {(0, 0, 0)} <= colours

        uploaded = json.loads(jaeger.read_text())
        assert list(uploaded) == ["data"] and len(uploaded["data"]) == 7
        assert {t["traceID"].rjust(32, "0") for t in uploaded["data"]} == {r["trace_id"] for r in want}
        for trace in uploaded["data"]:
            assert_jaeger_ui_trace(trace)
            assert [trace] == httpx.get(f"{api}/api/traces/{trace['traceID']}").json()["data"]


def otlp_json(request) -> dict:
    """A request as OTLP/JSON writes it: protobuf's JSON mapping with the ids in hex."""
    doc = json_format.MessageToDict(request)
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return doc


@pytest.mark.parametrize("layout", ["lines", "document"])
def test_vllm_spans_from_an_otlp_json_file_get_the_derived_phases(tmp_path, layout, capsys, monkeypatch):
    monkeypatch.setattr("otel_llm.collector.timeline.cli._PROGRESS_EVERY_S", 0.0)
    spans = vllm_spans()
    requests = [vllm_request(spans[:1]), vllm_request(spans[1:])]
    path = tmp_path / "spans.json"
    if layout == "lines":  # as the OpenTelemetry Collector's file exporter writes
        path.write_text("".join(json.dumps(otlp_json(r)) + "\n" for r in requests))
    else:
        path.write_text(json.dumps(otlp_json(vllm_request(spans)), indent=2))
    out = tmp_path / "vllm.png"

    assert main(["timeline", "--otlp-json", str(path), "--out", str(out), "--data-out", str(tmp_path / "rows.json"),
                 "--jaeger-json", str(tmp_path / "jaeger.json")]) == 0
    err = capsys.readouterr().err
    assert f"read {len(requests) if layout == 'lines' else 1} OTLP export requests" in err  # progress
    assert f"{len(spans)} requests ({4 * len(spans)} spans)" in err
    data = json.loads((tmp_path / "rows.json").read_text())
    assert len(data["rows"]) == len(spans)
    for row, s in zip(data["rows"], sorted(spans, key=lambda s: s["start_time_unix_nano"])):
        attrs = s["attributes"]
        first = s["start_time_unix_nano"] + round(attrs["gen_ai.latency.time_to_first_token"] * 1e9)
        prefill_start = first - round(attrs["gen_ai.latency.time_in_model_prefill"] * 1e9)
        assert (row["trace_id"], row["name"], row["start_ns"]) == (s["trace_id"], "llm_request", s["start_time_unix_nano"])
        assert row["queue"] == [prefill_start - round(attrs["gen_ai.latency.time_in_queue"] * 1e9), prefill_start]
        assert row["prefill"] == [prefill_start, first]
        assert row["decode"] == [first, first + round(attrs["gen_ai.latency.time_in_model_decode"] * 1e9)]
        assert row["first_token_ns"] == first and row["preemptions_ns"] == [] and row["finish_reason"] is None
    assert_load_counts_the_rows(data)
    assert png_size(out) == tuple(round(x * 100) for x in figure_size_in(len(spans)))

    # the same traces as the collector's store holds them after ingesting the spans
    store = TraceStore(TraceStoreConfig(str(tmp_path / "store")))
    try:
        store.add(PhaseSpans().process(vllm_request(spans).SerializeToString()))
        want = [trace_json(store.trace(s["trace_id"])) for s in sorted(spans, key=lambda s: s["start_time_unix_nano"])]
    finally:
        store.close()
    uploaded = json.loads((tmp_path / "jaeger.json").read_text())
    assert uploaded == {"data": want}
    for trace in uploaded["data"]:
        assert_jaeger_ui_trace(trace)
        assert [s["operationName"] for s in trace["spans"]] == ["llm_request", "queue", "prefill", "decode"]


def test_the_window_chooses_requests_by_start_and_the_limit_the_failed_and_slowest_first(tmp_path, capsys):
    spans = sorted(vllm_spans(), key=lambda s: s["start_time_unix_nano"])
    path = tmp_path / "spans.json"
    path.write_text(json.dumps(otlp_json(vllm_request(spans))) + "\n")
    t1_us = spans[1]["start_time_unix_nano"] // 1000

    def rows(*args: str) -> list[str]:
        assert main(["timeline", "--otlp-json", str(path), "--out", str(tmp_path / "t.png"), *args]) == 0
        return [r["trace_id"] for r in json.loads((tmp_path / "t.json").read_text())["rows"]]

    iso = (datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=t1_us)).isoformat()
    assert rows("--start", iso) == [s["trace_id"] for s in spans[1:]]
    assert rows("--end", iso) == [s["trace_id"] for s in spans[:2]]
    slowest = max(spans, key=lambda s: s["attributes"]["gen_ai.latency.e2e"])
    assert rows("--limit", "1") == [slowest["trace_id"]]  # not the first: none failed, so the slowest
    assert json.loads((tmp_path / "t.json").read_text())["overview"]["requests"] == len(spans)  # all, in the file
    err = capsys.readouterr().err
    assert "holds 3 requests, more than --limit 1: drawing the failed, the slowest by e2e" in err, err


@pytest.mark.parametrize("args, code, message", [
    (["--trace-store", "{tmp}/nowhere"], 2, "no trace store in"),
    (["--otlp-json", "{tmp}/missing.json"], 2, "no file"),
    (["--otlp-json", "{tmp}/bad.json"], 2, "bad.json:2: malformed OTLP JSON"),
    (["--otlp-json", "{tmp}/empty.json"], 1, "no request in {tmp}/empty.json between the beginning and the end: "
                                             "nothing written"),
    (["--trace-store", "{tmp}/store", "--end", "2001-01-01T00:00:00Z"], 1, "no request in trace store"),
    (["--trace-store", "{tmp}/store", "--last", "5m", "--start", "2001-01-01"], 2, "--last replaces --start/--end"),
    (["--trace-store", "{tmp}/store", "--start", "2002-01-01", "--end", "2001-01-01"], 2, "is after --end"),
    (["--trace-store", "{tmp}/store", "--out", "{tmp}/t.xyz"], 2, "use one of the extensions"),
    (["--trace-store", "{tmp}/store", "--out", "{tmp}/no/dir/t.png"], 2, "no directory"),
    (["--trace-store", "{tmp}/store", "--out", "{tmp}/t.png", "--jaeger-json", "{tmp}/t.json"], 2,
     "must be different files"),
])
def test_bad_inputs_exit_with_a_message(tmp_path, capsys, args, code, message):
    tmp = str(tmp_path)
    TraceStore(TraceStoreConfig(f"{tmp}/store")).close()  # an empty store
    (tmp_path / "bad.json").write_text(json.dumps(otlp_json(vllm_request())) + '\n{"resourceSpans": 5}\n')
    (tmp_path / "empty.json").write_text("")
    assert main(["timeline", *(a.format(tmp=tmp) for a in args)]) == code
    err = capsys.readouterr().err
    assert message.format(tmp=tmp) in err and err.startswith("otel-llm timeline: ")
    assert not (tmp_path / "t.png").exists() and not (tmp_path / "t.json").exists()
    assert not Path(tmp, "nowhere").exists()  # a missing store is not created


@pytest.mark.parametrize("flag, value", [("--start", "yesterday"), ("--end", "2025-13-01"), ("--last", "soon")])
def test_bad_times_are_refused_by_the_parser(flag, value, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["timeline", "--otlp-json", "x.json", flag, value])
    assert exited.value.code == 2 and f"invalid {'duration' if flag == '--last' else 'time'} {value!r}" in \
        capsys.readouterr().err


MS = 1_000_000


def step_columns(n: int, first_ns: int) -> dict[str, np.ndarray]:
    """`n` steps of 15 ms every 20 ms from `first_ns` (whole µs, as a window span keeps them): a
    prefill every fifth, batches of 1 to 3, a preemption in the tenth; `EngineLane.columns`' layout."""
    start = first_ns + 20 * MS * np.arange(n, dtype=np.int64)
    i = np.arange(n)
    return {"start_ns": start, "end_ns": start + 15 * MS, "forward_ns": np.full(n, 9 * MS, np.int64),
            "forward_source": np.full(n, ForwardSource.HOST, np.int8), "kv_usage": np.linspace(0.1, 0.5, n),
            "prefill_tokens": np.where(i % 5 == 0, 12, 0), "decode_tokens": np.where(i % 5 == 0, 0, 1 + i % 3),
            "num_requests": 1 + i % 3, "running": 1 + i % 3, "waiting": i % 2, "preemptions": (i == 10).astype(int),
            "blocked": np.zeros(n, np.int64)}


def lane_window(n: int, cols: dict[str, np.ndarray], instance: str = "i-1"):
    """One `engine steps` window span of `cols`, a trace of its own, as `RequestTracer.emit_lane` sends it."""
    start, end = int(cols["start_ns"][0]), int(cols["end_ns"][-1])
    span = trace_pb2.Span(trace_id=tid(1000 + n), span_id=sid(1000 + n, 1), name=LANE_SPAN, kind=INTERNAL,
                          start_time_unix_nano=start, end_time_unix_nano=end,
                          attributes=kvs({"gen_ai.request.model": "m", "otel_llm.engine": "0",
                                          **lane_attributes(cols, start)}))
    return trace_request([span], **{"service.instance.id": instance})


def write_source(tmp_path: Path, kind: str, requests: list) -> list[str]:
    """The `requests` as a trace store or an OTLP/JSON file, and the flag that reads it."""
    if kind == "otlp-json":
        path = tmp_path / "spans.json"
        path.write_text("".join(json.dumps(otlp_json(r)) + "\n" for r in requests))
        return ["--otlp-json", str(path)]
    store = TraceStore(TraceStoreConfig(str(tmp_path / "store")))
    try:
        for r in requests:
            store.add(r.SerializeToString())
    finally:
        store.close()
    return ["--trace-store", str(tmp_path / "store")]


def iso(t_ns: int) -> str:
    return (datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=t_ns // 1000)).isoformat()


@pytest.mark.parametrize("kind", ["trace-store", "otlp-json"])
def test_the_engine_lane_is_read_drawn_and_written_as_its_steps(tmp_path, kind, capsys):
    """Three requests (instance i-1, 0.5 s each, 100 ms apart) and the lane of their engine in two
    windows, plus a step 5 s later; --end at the last request's start: the lane runs to the last row's end."""
    requests = [trace_request(llm_spans(n, T0_NS + (n - 1) * 100 * MS), **{"service.instance.id": "i-1"})
                for n in (1, 2, 3)]
    steps = step_columns(36, T0_NS + 10 * MS)  # the last starts 710 ms after T0: after the last row's end, 700 ms
    windows = [{c: v[:20] for c, v in steps.items()}, {c: v[20:] for c, v in steps.items()}]
    late = step_columns(1, T0_NS + 5000 * MS)
    args = write_source(tmp_path, kind, [*requests, lane_window(1, windows[0]), lane_window(2, windows[1]),
                                         lane_window(3, late)])
    out = tmp_path / "t.png"

    assert main(["timeline", *args, "--end", iso(T0_NS + 200 * MS), "--out", str(out), "--dpi", "50"]) == 0
    assert "1 engine lane (35 steps)" in capsys.readouterr().err
    [lane] = json.loads((tmp_path / "t.json").read_text())["lanes"]
    kept = {c: v[:35] for c, v in steps.items()}  # those that started by the last row's end
    assert (lane["service"], lane["instance"], lane["model"], lane["engine"]) == ("llm", "i-1", "m", "0")
    assert lane["start_us"] == (kept["start_ns"] // 1000).tolist()
    assert lane["end_us"] == (kept["end_ns"] // 1000).tolist()
    for column in ("prefill_tokens", "decode_tokens", "num_requests", "running", "waiting", "preemptions"):
        assert lane[column] == kept[column].tolist(), column
    assert lane["forward_us"] == [9000] * 35
    width_in, height_in = figure_size_in(3, 1)
    assert png_size(out) == (round(width_in * 50), round(height_in * 50))
    assert height_in > figure_size_in(3)[1]

    # --limit 1 draws one chosen request; the lane still covers the window (here, all of it)
    assert main(["timeline", *args, "--limit", "1", "--out", str(out)]) == 0
    data = json.loads((tmp_path / "t.json").read_text())
    assert len(data["rows"]) == 1
    [lane] = data["lanes"]
    assert lane["start_us"] == (np.concatenate([steps["start_ns"], late["start_ns"]]) // 1000).tolist()


def test_more_lanes_than_drawn_are_all_written_and_no_lane_draws_as_before(tmp_path, capsys):
    rows = [trace_request(llm_spans(n, T0_NS + n * MS), **{"service.instance.id": f"i-{n}"}) for n in range(6)]
    lanes = [lane_window(n, step_columns(3 + n, T0_NS + n * MS), instance=f"i-{n}") for n in range(MAX_LANES + 1)]
    args = write_source(tmp_path, "trace-store", [*rows, *lanes])
    out = tmp_path / "t.png"
    assert main(["timeline", *args, "--out", str(out), "--dpi", "40"]) == 0
    assert f"{MAX_LANES + 1} engine lanes ({sum(range(3, 3 + MAX_LANES + 1))} steps)" in capsys.readouterr().err
    data = json.loads((tmp_path / "t.json").read_text())
    assert [(lane["instance"], len(lane["end_us"])) for lane in data["lanes"]] == [
        (f"i-{n}", 3 + n) for n in range(MAX_LANES + 1)]
    assert png_size(out) == tuple(round(x * 40) for x in figure_size_in(6, MAX_LANES)) == \
        tuple(round(x * 40) for x in figure_size_in(6, MAX_LANES + 1))

    bare = tmp_path / "bare"
    bare.mkdir()
    args = write_source(bare, "trace-store", rows)
    assert main(["timeline", *args, "--out", str(out), "--dpi", "40"]) == 0
    assert "no engine lane" in capsys.readouterr().err
    assert json.loads((tmp_path / "t.json").read_text())["lanes"] == []
    assert png_size(out) == tuple(round(x * 40) for x in figure_size_in(6))


def test_the_overview_counts_every_request_of_the_window_whatever_the_limit(tmp_path, capsys):
    """3,000 requests in a store, --limit 50: 50 rows drawn, and above them the overview of all 3,000 by
    --metric, its columns fitted to the requests (the window is open), as the store's heatmap has it."""
    from otel_llm.collector.tracestore.store import TraceStore, TraceStoreConfig
    from tests.collector.tracestore.test_drill_down import fill, workload

    reqs = workload(3000)
    store = TraceStore(TraceStoreConfig(str(tmp_path / "store")))
    fill(store, reqs)
    store.close()
    out = tmp_path / "t.png"
    assert main(["timeline", "--trace-store", str(tmp_path / "store"), "--limit", "50", "--metric", "e2e",
                 "--out", str(out), "--dpi", "40"]) == 0
    assert "holds 3000 requests, more than --limit 50" in capsys.readouterr().err
    data = json.loads((tmp_path / "t.json").read_text())
    overview = data["overview"]
    assert len(data["rows"]) == 50 and overview["metric"] == "e2e"
    assert overview["requests"] == sum(c[2] for c in overview["cells"]) == 3000
    first, last = min(r["start_us"] for r in reqs), max(r["start_us"] for r in reqs)
    assert overview["start_us"] <= first < overview["start_us"] + overview["step_us"]
    assert last < overview["start_us"] + overview["columns"] * overview["step_us"] <= last + 2 * overview["step_us"]
    store = TraceStore(TraceStoreConfig(str(tmp_path / "store")))
    try:
        assert overview == json.loads(json.dumps(store.heatmap("e2e", 0, (1 << 63) - 1, fit=True)))
    finally:
        store.close()
    width_in, height_in = figure_size_in(50)
    assert png_size(out) == (round(width_in * 40), round(height_in * 40))
    assert height_in > figure_size_in(50, overview=False)[1]
    with pytest.raises(SystemExit) as bad:  # argparse's usage error
        main(["timeline", "--trace-store", str(tmp_path / "store"), "--metric", "p99", "--out", str(out)])
    assert bad.value.code == 2 and "invalid choice: 'p99'" in capsys.readouterr().err
