"""SLOs end to end: the real server judging goodput (`--slo-config`), a real Prometheus per profile
scraping it with that profile's generated rules (`otel-llm slo rules`), under a load that breaks the
TTFT objective: the fast-burn page alert is pending from the evaluation after the scrape that saw
the first breaking request, fires on Prometheus's `/api/v1/alerts` within the rule's `for` plus two
evaluation intervals of that, and every query of every profile's generated dashboard (`otel-llm slo
dashboard`) returns data."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml
import openai
from openai import OpenAI

from otel_llm.canonical import instruments as I
from otel_llm.shim.profiles import PROFILE_NAMES, get_profile
from otel_llm.slo.config import parse_slo_config
from otel_llm.slo.dashboard import dashboard, queries
from otel_llm.slo.rules import CANONICAL, rules
from tests.harness.prometheus import PrometheusServer
from tests.server.api.api_server_harness import ServerProcess

MODEL = "m"
INTERVAL_S = 1.0  # Prometheus's scrape and rule evaluation interval here
PAGE_FOR_S = 120  # the generated page alert's `for: 2m`
BROKEN_TTFT = 0.001  # s: no request of the null model (a 2 ms step) meets it


def profile_slo(profile_name: str) -> dict:
    """Every objective the profile can express, at a middle bucket boundary of its family (the vllm
    profile's TTFT at 1 ms: broken), for the server's model."""
    profile = get_profile(profile_name)
    entry: dict = {"model": MODEL} if profile.model_label else {}
    for kind, canonical in CANONICAL.items():
        fam = next((f for f in profile.families if f.canonical == canonical and f.part is None), None)
        if fam is not None:
            bounds = fam.buckets or tuple(b * fam.scale for b in I.instrument_table(8192)[canonical].buckets)
            entry[kind] = {"threshold": bounds[len(bounds) // 2] / fam.scale, "target": 0.99}
    if profile_name == "vllm":
        entry["ttft"]["threshold"] = BROKEN_TTFT
    if profile_name != "sglang":  # (SGLang counts aborted requests only)
        entry["errors"] = {"target": 0.999}
    return {"objectives": [entry]}


class RulesPrometheus(PrometheusServer):
    """A Prometheus scraping `/metrics?compat=PROFILE` and evaluating a rule file."""

    def __init__(self, target: str, profile: str, rule_file: str):
        super().__init__(target, job=profile, params={"compat": profile}, scrape_interval_s=INTERVAL_S)
        self.rule_file = rule_file

    def _config(self) -> dict:
        return {**super()._config(), "rule_files": [self.rule_file]}

    def alerts(self) -> list[dict]:
        return self._get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"]


def _load(url: str, stop: threading.Event, first_done: list[float]) -> None:
    """Completions and chats, half streamed, until `stop`; the wall time of the first one's end."""
    client = OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)
    i = 0
    while not stop.is_set():
        i += 1
        try:
            if i % 2:
                client.completions.create(model=MODEL, prompt=f"hello {i}", max_tokens=8, stream=i % 4 == 1)
            else:
                for _ in client.chat.completions.create(model=MODEL, max_tokens=8, stream=True,
                                                        messages=[{"role": "user", "content": f"hi {i}"}]):
                    pass
        except openai.APIConnectionError:
            if stop.is_set():  # the server stops at the end
                return
            raise
        if not first_done:
            first_done.append(time.time())
        stop.wait(0.2)


def _unix(rfc3339: str) -> float:
    """Prometheus's RFC 3339 time (nanosecond fractions) as unix seconds."""
    whole, _, rest = rfc3339.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole + "+00:00").timestamp() + (float("0." + rest) if rest else 0.0)


def _page(alert: dict) -> bool:
    labels = alert["labels"]
    return labels["alertname"] == "LLMSLOErrorBudgetBurn" and labels["severity"] == "page" and labels["slo"] == "ttft"


class Scenario:
    """The server, a Prometheus per profile and the load, with a watcher noting when the page alert
    fires. Its two minutes run beside the other integration tests: `tests/integration/conftest.py`
    starts it in the background when the first of them starts (and the test starts it otherwise)."""

    def __init__(self):
        self.started, self.ready, self.done = threading.Event(), threading.Event(), threading.Event()
        self.stop = threading.Event()
        self.server, self.proms, self.configs, self.first_done = None, {}, {}, []
        self.dir, self.load = Path(tempfile.mkdtemp(prefix="otel-llm-slo-")), None
        self.fired_at: float | None = None  # when the watcher saw the page alert firing
        self.active_at: float | None = None  # the evaluation at which its condition first held (Prometheus's)
        self.error: BaseException | None = None

    def start_in_background(self) -> None:
        if not self.started.is_set():
            self.started.set()
            threading.Thread(target=self._run, name="slo-scenario", daemon=True).start()

    def _run(self) -> None:
        try:
            self._setup(self.dir)
            self.load = threading.Thread(target=_load, args=(self.server.url, self.stop, self.first_done), daemon=True)
            self.load.start()
            self.ready.set()
            vllm, deadline = self.proms["vllm"], time.time() + PAGE_FOR_S + 60
            while self.fired_at is None and time.time() < deadline and not self.stop.is_set():
                firing = [a for a in vllm.alerts() if _page(a) and a["state"] == "firing"]
                if firing:
                    self.fired_at, self.active_at = time.time(), _unix(firing[0]["activeAt"])
                time.sleep(0.25)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.ready.set()
            self.done.set()

    def _setup(self, d: Path) -> None:
        (d / "server-slo.yaml").write_text(yaml.safe_dump(
            {"objectives": [{"ttft": {"threshold": BROKEN_TTFT, "target": 0.99},
                             "e2e": {"threshold": 10, "target": 0.99}, "errors": {"target": 0.999}}]}))
        self.server = ServerProcess("--model", "null", "--null-step-ms", "2", "--served-model-name", MODEL,
                                    "--slo-config", str(d / "server-slo.yaml")).start()
        for name in PROFILE_NAMES:
            self.configs[name] = parse_slo_config(profile_slo(name))
            rule_file = d / f"{name}.rules.yml"
            rule_file.write_text(yaml.safe_dump(rules(self.configs[name], name), sort_keys=False, width=1000))
            self.proms[name] = RulesPrometheus(f"127.0.0.1:{self.server.port}", name, str(rule_file))
            self.proms[name].start()
        for prom in self.proms.values():
            prom.wait_for_scrapes(2)

    def close(self) -> None:
        self.stop.set()
        self.done.wait(30)
        if self.load is not None:
            self.load.join(30)
        for prom in self.proms.values():
            prom.stop()
        if self.server is not None:
            self.server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


SCENARIO = Scenario()


@pytest.fixture(scope="module")
def scenario():
    SCENARIO.start_in_background()
    try:
        yield SCENARIO
    finally:
        SCENARIO.close()


def test_the_fast_burn_alert_fires_when_ttft_breaks_and_dashboards_show_data(scenario):
    bound = PAGE_FOR_S + 2 * INTERVAL_S  # `for` + two evaluation intervals
    assert scenario.done.wait(PAGE_FOR_S + 120), "the scenario did not end"
    if scenario.error is not None:
        raise scenario.error
    vllm = scenario.proms["vllm"]
    assert scenario.fired_at is not None, f"no firing page alert; alerts: {vllm.alerts()}\n{vllm.log_tail()}"
    broken = scenario.active_at - scenario.first_done[0]  # the burn seen at the scrape and evaluation after it
    took = scenario.fired_at - scenario.active_at
    assert -INTERVAL_S <= broken <= 2 * INTERVAL_S + 1, broken  # (+1: the first request's own end, an HTTP turn)
    assert took <= bound + 0.5, (took, bound)  # (+0.5: the watcher polls every 0.25 s)
    print(f"page alert pending {broken:.1f} s after the first breaking request, firing {took:.1f} s later "
          f"(bound: for + two evaluation intervals = {bound:g} s)")
    firing = [a for a in vllm.alerts() if _page(a) and a["state"] == "firing"]
    assert firing and firing[0]["labels"]["model"] == MODEL
    others = [a["labels"]["slo"] for a in vllm.alerts() if a["labels"]["slo"] != "ttft"]
    assert others == [], others  # only the broken objective burns
    for name, prom in scenario.proms.items():
        empty = [q for q in queries(dashboard(scenario.configs[name], name)) if not prom.query(q)]
        assert empty == [], f"profile {name}: dashboard queries without data: {empty}"
