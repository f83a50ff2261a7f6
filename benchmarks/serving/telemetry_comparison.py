"""`--compare-telemetry`: telemetry fully on against fully off (and an A/A control), time-sliced rounds."""

from __future__ import annotations

from benchmarks.serving import log
from benchmarks.serving.server_process import ManagedServer
from benchmarks.serving.span_receiver import ReceiverProcess, wait_spans
from benchmarks.serving.summary import median, median_ci90, ratio, server_cpu_medians
from benchmarks.serving.time_slicing import time_sliced
from benchmarks.serving.workload import workloads


def compare_telemetry(args) -> dict:
    """`--repeats` rounds; each starts the servers afresh (telemetry off, on, and with
    `--aa-control` a second off server, "control") and runs the saturation load against all
    of them time-sliced (`time_sliced`). Headline ratios are medians over rounds of the
    per-round on/off ratios; the control/off ratios are what two identical servers measure
    here, the resolution of the method."""
    modes = ("off", "on", "control") if args.aa_control else ("off", "on")
    name, reqs = workloads(args)[0]
    rounds = []
    with ReceiverProcess() as rx:
        traces_url = None if args.no_traces else f"{rx.endpoint}/v1/traces"
        for r in range(args.repeats):
            order = modes[r % len(modes):] + modes[:r % len(modes)]  # each mode leads the slices in turn
            servers = {mode: ManagedServer(args.server_model, mode == "on", traces_url, args.max_num_seqs,
                                           args.server_arg) for mode in order}
            try:
                for srv in servers.values():
                    srv.wait_ready()
                rounds.append(time_sliced(servers, reqs, args, f"round {r + 1}", rx.pid))
            finally:
                for srv in servers.values():
                    srv.stop()
        spans_before_shutdown = wait_spans(rx, args.span_wait)
        spans, span_names, _ = rx.stats()
    p99 = lambda load: load["itl_ms"] and load["itl_ms"]["p99"]  # noqa: E731
    result: dict = {"workload": name, "method": "time_sliced", "slice_s": args.slice}
    for other, prefix, suffix in (("on", "", "_on_vs_off"), ("control", "control_", "")):
        if other in modes:
            thr = [ratio(rd[other]["output_token_throughput"], rd["off"]["output_token_throughput"]) for rd in rounds]
            itl = [ratio(p99(rd[other]), p99(rd["off"])) for rd in rounds]
            result[f"{prefix}throughput_ratio{suffix}"] = median(thr)
            result[f"{prefix}p99_itl_ratio{suffix}"] = median(itl)
            result[f"{prefix}throughput_ratio_ci90"] = median_ci90(thr)
            result[f"{prefix}p99_itl_ratio_ci90"] = median_ci90(itl)
            result[f"{prefix}throughput_ratio_per_round"] = [round(x, 4) for x in thr]
            result[f"{prefix}p99_itl_ratio_per_round"] = [round(x, 4) for x in itl]
    result["tok_s_per_round"] = {m: [round(rd[m]["output_token_throughput"]) for rd in rounds] for m in modes}
    result["p99_itl_ms_per_round"] = {m: [round(p99(rd[m]), 3) for rd in rounds] for m in modes}
    result["server_cpu_us_per_token"] = server_cpu_medians(rounds, modes)
    result["counts_exact_every_round"] = all(
        rd["on"]["counts"] and all(c["exact"] for c in rd["on"]["counts"].values()) for rd in rounds)
    result["failed_requests"] = sum(rd[m]["failed"] for rd in rounds for m in modes)
    result["valid"] = result["failed_requests"] == 0 and result["counts_exact_every_round"]
    if not result["valid"]:
        log(f"WARNING: {result['failed_requests']} requests failed or /metrics counts were off: "
            "the ratios do not compare like with like (see rounds[*][mode]['errors'] and ['counts'])")
    result["spans_received"] = spans
    result["spans_received_before_shutdown"] = spans_before_shutdown
    result["span_names"] = span_names
    result["rounds"] = rounds
    return result
