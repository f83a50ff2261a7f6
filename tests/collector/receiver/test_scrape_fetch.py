"""A target's GETs over one kept-alive connection: reused from scrape to scrape, replaced when the target
closed it, dropped after a failure; the deadline still bounds every scrape, and never cuts a connection
whose scrape ended; redirects and error statuses answer as urllib's did. Real HTTP servers, no mocks."""

from __future__ import annotations

import http.server
import time

import pytest

from otel_llm.collector.receiver.scrape import ScrapeTarget
from otel_llm.collector.receiver.scrape_convert import ScrapeError
from otel_llm.collector.receiver.scrape_fetch import Fetcher
from tests.harness.scripted_http import serve_http, stop_http

BODY = "# TYPE up_total counter\nup_total 1\n"


class Target:
    """An HTTP/1.1 (keep-alive) /metrics whose next answers a test sets: `plan` pops one per GET
    ("ok", "close": answer then close the connection silently, "hang", "redirect", or a status)."""

    def __init__(self) -> None:
        self.plan: list[str] = []
        self.connections = 0
        target = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self):
                super().setup()
                target.connections += 1

            def do_GET(self):
                what = target.plan.pop(0) if target.plan else "ok"
                if what == "hang":
                    time.sleep(3)
                    return
                if what == "redirect":
                    self.send_response(302)
                    self.send_header("Location", "/elsewhere")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = int(what) if what.isdigit() else 200
                data = (BODY if self.path in ("/metrics", "/elsewhere") else "no\n").encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                if what == "close":  # as a server whose keep-alive timeout passed between two scrapes
                    self.close_connection = True

            def log_message(self, *args):
                pass

        self.server = serve_http(Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def close(self) -> None:
        stop_http(self.server)


@pytest.fixture
def target():
    t = Target()
    yield t
    t.close()


def fetcher(target: Target, timeout_s: float = 2.0) -> Fetcher:
    return Fetcher(ScrapeTarget(target.url, "j", 5.0, timeout_s))


def test_scrapes_reuse_one_connection(target):
    f = fetcher(target)
    assert [f.fetch() for _ in range(5)] == [(BODY, False)] * 5
    assert target.connections == 1
    f.close()


def test_a_connection_the_target_closed_between_scrapes_is_replaced_at_once(target):
    f = fetcher(target)
    target.plan = ["close", "close", "ok"]
    assert [f.fetch() for _ in range(4)] == [(BODY, False)] * 4  # no scrape fails for it
    assert target.connections == 3
    f.close()


def test_an_error_status_fails_that_scrape_only(target):
    f = fetcher(target)
    f.fetch()
    target.plan = ["503"]
    with pytest.raises(ScrapeError, match="HTTP 503 Service Unavailable") as err:
        f.fetch()
    assert err.value.reason == "http_status"
    assert f.fetch() == (BODY, False)


def test_a_redirect_is_followed(target):
    f = fetcher(target)
    target.plan = ["redirect", "redirect", "redirect"]
    assert f.fetch() == (BODY, False)
    assert f.fetch() == (BODY, False)  # urllib's way from then on: one redirect a scrape
    assert target.plan == []


def test_a_kept_connection_that_hangs_is_cut_at_the_deadline_and_replaced(target):
    f = fetcher(target, timeout_s=0.5)
    f.fetch()
    target.plan = ["hang"]
    t0 = time.monotonic()
    with pytest.raises(ScrapeError, match="within 0.5s") as err:
        f.fetch()
    assert err.value.reason == "timeout" and time.monotonic() - t0 < 1.5
    assert f.fetch() == (BODY, False)
    assert target.connections == 2


def test_the_deadline_of_a_scrape_that_ended_leaves_its_connection_alone(target):
    f = fetcher(target, timeout_s=0.2)
    f.fetch()
    time.sleep(0.5)  # that scrape's deadline passes, long after it ended
    assert f.fetch() == (BODY, False)
    assert target.connections == 1
    f.close()
