"""Real Prometheus for tests: ``promtool check metrics`` and a scraping server.

Both use the Debian ``prometheus`` package (2.42: ``/usr/bin/promtool`` and
``/usr/bin/prometheus``); ``.ci/run`` installs it. Nothing here is mocked.
"""

import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType

from tests.harness.ports import free_port

_INSTALL_HINT = "install the Debian package: apt-get install -y prometheus (see .ci/run)"
_LOG_TAIL_LINES = 30


class PromtoolError(RuntimeError):
    """promtool is missing, or could not parse the exposition at all."""


class PrometheusError(RuntimeError):
    """The Prometheus server failed to start, answer, or scrape in time."""


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise PromtoolError(f"{name!r} not found on PATH; {_INSTALL_HINT}")
    return path


def promtool_check_metrics(text: str, timeout_s: float = 30.0) -> list[str]:
    """Lint a Prometheus text exposition with ``promtool check metrics``.

    Returns promtool's finding lines, e.g.
    ``'foo counter metrics should have "_total" suffix'``; an empty list means
    clean. Raises PromtoolError when promtool is missing or cannot parse the
    text (its exit status 1), since then there are no lint findings to return.
    promtool 2.42 exits 0 when clean and 3 with findings, written to stderr.
    """
    proc = subprocess.run(
        [_binary("promtool"), "check", "metrics"],
        input=text.encode(),
        capture_output=True,
        timeout=timeout_s,
        check=False,
    )
    output = (proc.stdout + proc.stderr).decode(errors="replace")
    lines = [line for line in output.splitlines() if line.strip()]
    if proc.returncode in (0, 3):
        return lines
    raise PromtoolError(f"promtool check metrics exited {proc.returncode}: {output.strip()}")


class PrometheusServer:
    """A real ``prometheus`` process scraping one ``host:port`` target.

    Listens on its own free loopback port with its own temporary config and
    storage directory; scrape and evaluation interval default to 1 s. Use as a
    context manager: entering starts it and waits for ``/-/ready``, exiting
    stops the process and removes the directory. The scrape job is named
    ``job`` (default ``"target"``). Not thread-safe; one test owns it.
    """

    def __init__(
        self,
        target: str | None,
        *,
        metrics_path: str = "/metrics",
        job: str = "target",
        scrape_interval_s: float = 1.0,
        startup_timeout_s: float = 30.0,
        honor_labels: bool = False,
        extra_flags: tuple[str, ...] = (),
        params: dict[str, str] | None = None,
    ) -> None:
        """``target=None``: no scrape job (e.g. a remote-write receiver only, with
        ``extra_flags=("--web.enable-remote-write-receiver",)``). ``honor_labels``
        keeps the target's own ``job``/``instance`` labels (needed behind a collector).
        ``params``: URL parameters of the scrape (e.g. ``{"compat": "sglang"}``)."""
        if target is not None and ":" not in target:
            raise ValueError(f"target must be 'host:port', got {target!r}")
        if scrape_interval_s <= 0:
            raise ValueError(f"scrape_interval_s must be > 0, got {scrape_interval_s!r}")
        self.target = target
        self.metrics_path = metrics_path
        self.job = job
        self.scrape_interval_s = scrape_interval_s
        self.startup_timeout_s = startup_timeout_s
        self.honor_labels = honor_labels
        self.extra_flags = tuple(extra_flags)
        self.params = dict(params or {})
        self.port: int | None = None
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = None

    @property
    def url(self) -> str:
        """Base URL of the web API, e.g. ``http://127.0.0.1:40123``."""
        if self.port is None:
            raise PrometheusError("PrometheusServer is not started")
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "PrometheusServer":
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        binary = _binary("prometheus")
        self._dir = Path(tempfile.mkdtemp(prefix="otel-llm-prometheus-"))
        config_path = self._dir / "prometheus.yml"
        # JSON is valid YAML; no YAML library needed.
        config_path.write_text(json.dumps(self._config(), indent=2))
        # Another process may grab the probed port before prometheus binds it.
        for _ in range(3):
            self.port = free_port()
            self._spawn(binary, config_path)
            if self._wait_ready():
                return
            if "address already in use" not in self.log_tail().lower():
                break
            self._terminate()
        tail = self.log_tail()
        self.stop()
        raise PrometheusError(
            f"prometheus not ready within {self.startup_timeout_s}s; log tail:\n{tail}"
        )

    def stop(self) -> None:
        self._terminate()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def query(self, promql: str) -> list[dict]:
        """Run an instant query; return ``data.result`` of ``/api/v1/query``.

        For a vector result each item is ``{"metric": {...}, "value": [ts, "str"]}``.
        """
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        body = self._get_json(url)
        if body.get("status") != "success":
            raise PrometheusError(f"query {promql!r} failed: {body}")
        result = body["data"]["result"]
        if body["data"]["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return result

    def value(self, promql: str) -> float:
        """Run an instant query that must return exactly one sample; its value."""
        result = self.query(promql)
        if len(result) != 1:
            raise PrometheusError(f"query {promql!r} returned {len(result)} series: {result}")
        return float(result[0]["value"][1])

    def wait_for_scrapes(self, n: int, timeout_s: float = 30.0) -> None:
        """Block until the target has been scraped successfully ``n`` times.

        The first scrape can come up to ~5 s after start: Prometheus' discovery
        manager publishes targets every 5 s. Raises PrometheusError with the
        target's last scrape error and the log tail on timeout.
        """
        promql = f'sum_over_time(up{{job="{self.job}"}}[1h])'
        deadline = time.monotonic() + timeout_s
        count = 0.0
        while time.monotonic() < deadline:
            result = self.query(promql)
            count = float(result[0]["value"][1]) if result else 0.0
            if count >= n:
                return
            time.sleep(min(0.2, self.scrape_interval_s / 2))
        raise PrometheusError(
            f"{count:.0f}/{n} successful scrapes of {self.target} after {timeout_s}s; "
            f"target state: {self._target_state()}; log tail:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        if self._dir is None:
            return "<no log>"
        log_path = self._dir / "prometheus.log"
        if not log_path.exists():
            return "<no log>"
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])

    def _config(self) -> dict:
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        return {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "scrape_configs": [] if self.target is None else [
                {
                    "job_name": self.job,
                    "metrics_path": self.metrics_path,
                    "honor_labels": self.honor_labels,
                    "static_configs": [{"targets": [self.target]}],
                    **({"params": {k: [v] for k, v in self.params.items()}} if self.params else {}),
                }
            ],
        }

    def _spawn(self, binary: str, config_path: Path) -> None:
        assert self._dir is not None
        self._log = open(self._dir / "prometheus.log", "ab")
        self._proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self._dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=info",
                *self.extra_flags,
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self._dir,
        )

    def _wait_ready(self) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        return False

    def _terminate(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(timeout=10)
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def _target_state(self) -> str:
        try:
            targets = self._get_json(f"{self.url}/api/v1/targets")["data"]["activeTargets"]
        except (PrometheusError, KeyError) as exc:
            return f"<unavailable: {exc}>"
        if not targets:
            return "<no active targets yet: service discovery publishes every 5 s>"
        return "; ".join(
            f"{t['scrapeUrl']} health={t['health']} lastError={t['lastError']!r}" for t in targets
        )

    def _get_json(self, url: str) -> dict:
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise PrometheusError(
                f"GET {url} -> {exc.code}: {exc.read().decode(errors='replace')}"
            ) from exc
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise PrometheusError(f"GET {url} failed: {exc}; log tail:\n{self.log_tail()}") from exc
