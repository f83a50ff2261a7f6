"""`--plot DIR`: the benchmark's pictures, with the data each one draws in `DIR/plots.json`.

- `latency_cdf.png`: the CDFs of TTFT, ITL and e2e (ms), one line per load (a workload such as
  "rate=10", or with `--compare-telemetry` a server: "on", "off", "control", rounds pooled);
- `throughput.png`: output token and request throughput against the offered rate (Poisson
  rates; `inf`, all at once, drawn at the right edge), one point per workload;
- `telemetry.png` (`--compare-telemetry`): each round's output token throughput and p99 ITL per
  server, the headline on/off ratios in the title.

matplotlib's Agg renderer, no pyplot (`pip install 'otel-llm[timeline]'`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

SIZE_IN, DPI = (12.0, 4.0), 100
_METRICS = (("ttft", "TTFT"), ("itl", "inter-token latency"), ("e2e", "end to end"))


def write_plots(report: dict, samples: dict[str, dict[str, list[float]]], directory: str | Path) -> list[Path]:
    """Draws the pictures `report` (serve_bench's JSON) has data for; returns the files written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = {"latency_cdf": {label: {key: sorted(values) for key, values in s.items()} for label, s in samples.items()}}
    runs = report.get("runs", [])
    if runs:
        data["throughput"] = [{"workload": r["workload"], "offered_rate": _offered(r["workload"]),
                               "output_token_throughput": r["output_token_throughput"],
                               "request_throughput": r["request_throughput"]} for r in runs]
    if report.get("rounds"):
        modes = list(report["rounds"][0])
        data["telemetry"] = {
            "modes": modes, "tok_s_per_round": report["tok_s_per_round"],
            "p99_itl_ms_per_round": report["p99_itl_ms_per_round"],
            "throughput_ratio_on_vs_off": report.get("throughput_ratio_on_vs_off"),
            "p99_itl_ratio_on_vs_off": report.get("p99_itl_ratio_on_vs_off")}
    written = [_draw(directory / "latency_cdf.png", _latency_cdf, data["latency_cdf"])]
    if "throughput" in data:
        written.append(_draw(directory / "throughput.png", _throughput, data["throughput"]))
    if "telemetry" in data:
        written.append(_draw(directory / "telemetry.png", _telemetry, data["telemetry"]))
    (directory / "plots.json").write_text(json.dumps(data, indent=1) + "\n")
    return written + [directory / "plots.json"]


def _offered(workload: str) -> float | None:
    """The offered rate of a "rate=R" workload (inf for all at once); None for a trace."""
    prefix = "rate="
    return float(workload[len(prefix):]) if workload.startswith(prefix) else None


def _draw(path: Path, draw, data) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=SIZE_IN, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    draw(fig, data)
    fig.savefig(path)
    return path


def _latency_cdf(fig, cdfs: dict) -> None:
    axes = fig.subplots(1, len(_METRICS))
    for ax, (key, title) in zip(axes, _METRICS):
        for label, values in cdfs.items():
            v = values[key]
            if v:
                ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=label)
        ax.set(title=title, xlabel="ms", ylabel="fraction of requests" if key == "ttft" else None, ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")


def _throughput(fig, points: list[dict]) -> None:
    req_ax, tok_ax = fig.subplots(1, 2)
    finite = [p["offered_rate"] for p in points if p["offered_rate"] is not None and math.isfinite(p["offered_rate"])]
    right = 1.25 * max(finite) if finite else 1.0  # where "all at once" is drawn
    xs = [right if p["offered_rate"] is None or math.isinf(p["offered_rate"]) else p["offered_rate"] for p in points]
    req_ax.plot([0, right], [0, right], ":", color="grey", label="served = offered")
    for ax, key, ylabel in ((req_ax, "request_throughput", "requests/s served"),
                            (tok_ax, "output_token_throughput", "output tokens/s")):
        ax.plot(xs, [p[key] for p in points], "o-", color="#3b6fb6")
        for x, p in zip(xs, points):
            ax.annotate(p["workload"], (x, p[key]), fontsize="small", textcoords="offset points", xytext=(4, 4))
        ax.set(xlabel="offered rate (requests/s; all at once at the right)", ylabel=ylabel, xlim=(0, right * 1.1))
        ax.grid(alpha=0.3)
    req_ax.legend(fontsize="small")
    fig.suptitle("throughput against offered rate")


def _telemetry(fig, data: dict) -> None:
    tok_ax, itl_ax = fig.subplots(1, 2)
    modes = data["modes"]
    rounds = len(data["tok_s_per_round"][modes[0]])
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        xs = np.arange(rounds) + i * width
        tok_ax.bar(xs, data["tok_s_per_round"][mode], width, label=mode)
        itl_ax.bar(xs, data["p99_itl_ms_per_round"][mode], width, label=mode)
    for ax, ylabel in ((tok_ax, "output tokens/s"), (itl_ax, "p99 ITL (ms)")):
        ax.set(xlabel="round", ylabel=ylabel, xticks=np.arange(rounds) + 0.4 - width / 2,
               xticklabels=[str(r + 1) for r in range(rounds)])
        ax.grid(alpha=0.3, axis="y")
    tok_ax.legend(fontsize="small")
    ratio, itl = data["throughput_ratio_on_vs_off"], data["p99_itl_ratio_on_vs_off"]
    fig.suptitle("telemetry on vs off, time-sliced rounds"
                 + (f": median throughput ratio {ratio:.3f}, p99 ITL ratio {itl:.3f}" if ratio and itl else ""))
