"""The server's /metrics against the client's view: exact request and token counts, mean TTFT and e2e."""

from __future__ import annotations

import httpx


SCRAPE_KEYS = ("vllm:request_success_total", "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
               "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
               "vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count")


def scrape(client: httpx.Client, url: str) -> dict | None:
    """The SCRAPE_KEYS samples of `url`'s /metrics, summed over label sets; None when it
    cannot be read or exposes no vLLM metrics (telemetry off)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        resp = client.get(f"{url}/metrics", timeout=30.0)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    sums: dict[str, float] = {}
    for fam in text_string_to_metric_families(resp.text):
        for s in fam.samples:
            if s.name in SCRAPE_KEYS:
                sums[s.name] = sums.get(s.name, 0.0) + float(s.value)
    return sums if "vllm:request_success_total" in sums else None


def deltas(before: dict | None, after: dict | None) -> dict | None:
    return None if before is None or after is None else {k: after.get(k, 0.0) - before.get(k, 0.0) for k in SCRAPE_KEYS}


def counts(d: dict, load: dict) -> dict:
    """Server /metrics deltas `d` against the client's request and token counts (exact)."""
    out = {}
    for name, key, client in (("requests", "vllm:request_success_total", load["completed"]),
                              ("generation_tokens", "vllm:generation_tokens_total", load["total_completion_tokens"]),
                              ("prompt_tokens", "vllm:prompt_tokens_total", load["total_prompt_tokens"])):
        delta = int(round(d[key]))
        out[name] = {"server_delta": delta, "client": client, "exact": delta == client}
    return out


def fidelity(before: dict | None, after: dict | None, load: dict, client_ttft_mean_s: float | None,
             client_e2e_mean_s: float | None) -> dict | None:
    d = deltas(before, after)
    if d is None:
        return None

    def tol(server: float | None, client: float | None) -> dict:
        if server is None or client is None:
            return {"server_ms": server and server * 1e3, "client_ms": client and client * 1e3,
                    "within_tolerance": False}
        diff = server - client
        return {"server_ms": server * 1e3, "client_ms": client * 1e3, "diff_ms": diff * 1e3,
                "tolerance_ms": max(0.05 * client, 0.002) * 1e3,
                "within_tolerance": abs(diff) <= max(0.05 * client, 0.002)}

    n_ttft, n_e2e = d["vllm:time_to_first_token_seconds_count"], d["vllm:e2e_request_latency_seconds_count"]
    return {
        **counts(d, load),
        "mean_ttft": tol(d["vllm:time_to_first_token_seconds_sum"] / n_ttft if n_ttft else None, client_ttft_mean_s),
        "mean_e2e": tol(d["vllm:e2e_request_latency_seconds_sum"] / n_e2e if n_e2e else None, client_e2e_mean_s),
    }
