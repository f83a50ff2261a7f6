"""TLS and credentials on every listener of a real Collector, end to end: the OTel SDK's exporters
(HTTP and gRPC), the collector's own trace exporter (another Collector), Prometheus-style scrapes
and the query API, with a throwaway CA made here; wrong or missing credentials are refused and
counted, never logged."""

import base64
import hashlib
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
import trustme
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from otel_llm.cli import build_parser
from otel_llm.cli.tls import TlsConfig
from otel_llm.collector import cli as collector_cli
from otel_llm.collector.extension import auth as auth_module
from otel_llm.collector.extension.auth import BasicAuth, BearerTokenAuth
from otel_llm.collector.http_endpoint import HttpServerSettings
from otel_llm.collector.service import Collector, CollectorConfig
from otel_llm.collector.tracestore.store import TraceStoreConfig

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def pki(ca, tmp_path) -> dict[str, str]:
    """PEM files: the CA, the server's certificate and key (127.0.0.1), a client certificate."""
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@example.com")
    files = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "cert.pem", "key": tmp_path / "key.pem",
             "client": tmp_path / "client.pem"}
    ca.cert_pem.write_to_path(files["ca"])
    server.cert_chain_pems[0].write_to_path(files["cert"])
    server.private_key_pem.write_to_path(files["key"])
    client.private_key_and_cert_chain_pem.write_to_path(files["client"])
    return {k: str(v) for k, v in files.items()}


@pytest.fixture
def token_file(tmp_path) -> str:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return str(path)


def secure_collector(pki, tmp_path, auth, client_ca: bool = False) -> Collector:
    tls = TlsConfig(pki["cert"], pki["key"], pki["ca"] if client_ca else None)
    return Collector(CollectorConfig(
        otlp_http_port=0, otlp_grpc_port=0, prometheus_port=0, jaeger_port=0,
        trace_store=TraceStoreConfig(str(tmp_path / "store")), http_server=HttpServerSettings(tls=tls, auth=auth)))


@pytest.fixture(autouse=True)
def no_requests_ca_bundle(monkeypatch) -> None:
    """requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override a session's own CA file, which is
    how the SDK's HTTP exporter passes OTEL_EXPORTER_OTLP_CERTIFICATE (docs/collector.md says so)."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)


@pytest.fixture
def collector(pki, tmp_path, token_file) -> Iterator[Collector]:
    with secure_collector(pki, tmp_path, BearerTokenAuth(token_file)) as collector:
        yield collector


def https_get(url: str, pki, authorization: str | None = None, client_cert: bool = False) -> tuple[int, dict, bytes]:
    context = ssl.create_default_context(cafile=pki["ca"])
    if client_cert:
        context.load_cert_chain(pki["client"])
    request = urllib.request.Request(url, headers={} if authorization is None else {"Authorization": authorization})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def send_span(exporter, name: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "tls-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span(name):
        pass
    provider.shutdown()


def stored_operations(collector: Collector, expected: int = 0) -> list[str]:
    """The operations stored, once there are `expected` (0: after a second that should add none)."""
    names: list[str] = []
    for _ in range(50 if expected else 10):
        names = sorted(op.name for op in collector.trace_store.operations("tls-test"))
        if expected and len(names) >= expected:
            break
        time.sleep(0.1)
    return names


def closed(collector: Collector, listener: str, reason: str) -> int:
    endpoint = {"otlp_http": collector.http.server, "prometheus": collector.scrape, "jaeger_query": collector.jaeger}
    return dict(endpoint[listener].stats().as_reasons())[reason]


def test_the_sdks_exporters_send_over_tls_with_a_bearer_token(collector, pki) -> None:
    send_span(HttpSpanExporter(f"{collector.http.endpoint}/v1/traces", certificate_file=pki["ca"],
                               headers={"Authorization": f"Bearer {TOKEN}"}), "over-http")
    credentials = grpc.ssl_channel_credentials(open(pki["ca"], "rb").read())
    send_span(GrpcSpanExporter(collector.grpc.endpoint, credentials=credentials,
                               headers=(("authorization", f"Bearer {TOKEN}"),)), "over-grpc")
    assert collector.http.endpoint.startswith("https://")
    assert stored_operations(collector, 2) == ["over-grpc", "over-http"]


def test_missing_or_wrong_credentials_are_refused_and_counted(collector, pki, caplog) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        exporter = HttpSpanExporter(f"{collector.http.endpoint}/v1/traces", certificate_file=pki["ca"],
                                    headers=headers)
        send_span(exporter, "refused")
    credentials = grpc.ssl_channel_credentials(open(pki["ca"], "rb").read())
    with grpc.secure_channel(collector.grpc.endpoint, credentials) as channel:
        export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                     request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as refused:
            export(b"", timeout=10, metadata=(("authorization", "Bearer wrong"),))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert closed(collector, "otlp_http", "unauthorized") == 3
    assert stored_operations(collector) == []
    assert "wrong" not in caplog.text and TOKEN not in caplog.text


@pytest.mark.parametrize("listener, path", [("prometheus", "/metrics"), ("jaeger_query", "/api/services"),
                                            ("jaeger_query", "/ui/")])
def test_metrics_query_api_and_ui_ask_for_the_token(collector, pki, listener, path) -> None:
    base = (collector.scrape if listener == "prometheus" else collector.jaeger).base_url
    status, headers, _ = https_get(base + path, pki)
    assert (status, headers["WWW-Authenticate"]) == (401, 'Bearer realm="otel-llm"')
    assert https_get(base + path, pki, f"Bearer {TOKEN}")[0] == 200
    assert closed(collector, listener, "unauthorized") == 1


def test_plain_http_and_untrusted_clients_fail_the_handshake(collector, pki) -> None:
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # http:// against the TLS port
        urllib.request.urlopen(collector.scrape.base_url.replace("https", "http") + "/metrics", timeout=5)
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):  # the system's CAs only
        urllib.request.urlopen(collector.scrape.base_url + "/metrics", timeout=5)
    deadline = time.monotonic() + 5
    while closed(collector, "prometheus", "tls_handshake_failed") < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert closed(collector, "prometheus", "tls_handshake_failed") == 2


def test_mutual_tls_needs_a_client_certificate_from_the_ca(pki, tmp_path) -> None:
    with secure_collector(pki, tmp_path, None, client_ca=True) as collector:
        assert https_get(collector.scrape.base_url + "/metrics", pki, client_cert=True)[0] == 200
        with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
            https_get(collector.scrape.base_url + "/metrics", pki)


def test_one_collector_forwards_to_another_over_tls_with_basic_auth(pki, tmp_path, monkeypatch) -> None:
    """The collector's own exporter sends the URL's credentials as basic auth; the receiving one
    checks them against an htpasswd file (plain, {SHA} and bcrypt lines)."""
    import bcrypt

    htpasswd = tmp_path / "htpasswd"
    sha = base64.b64encode(hashlib.sha1(b"sha-pw").digest()).decode()
    htpasswd.write_text(f"plain:plain-pw\nsha:{{SHA}}{sha}\n"
                        f"bc:{bcrypt.hashpw(b'bc-pw', bcrypt.gensalt(rounds=4)).decode()}\n")
    monkeypatch.setenv("SSL_CERT_FILE", pki["ca"])  # the sender trusts the throwaway CA, as an operator would
    with secure_collector(pki, tmp_path, BasicAuth.from_file(str(htpasswd))) as backend:
        for user, password in (("plain", "plain-pw"), ("sha", "sha-pw"), ("bc", "bc-pw")):
            url = f"https://{user}:{password}@127.0.0.1:{backend.http.server.port}/v1/traces"
            with Collector(CollectorConfig(otlp_http_port=0, otlp_grpc_port=None, prometheus_port=None,
                                           traces_to=(url,))) as front:
                send_span(HttpSpanExporter(f"{front.http.endpoint}/v1/traces"), f"via-{user}")
        assert stored_operations(backend, 3) == ["via-bc", "via-plain", "via-sha"]
        authorization = "Basic " + base64.b64encode(b"plain:wrong").decode()
        assert https_get(backend.scrape.base_url + "/metrics", pki, authorization)[0] == 401


def test_a_rotated_token_file_is_read_again(pki, tmp_path, token_file, monkeypatch) -> None:
    monkeypatch.setattr(auth_module, "_RELOAD_CHECK_S", 0.0)
    with secure_collector(pki, tmp_path, BearerTokenAuth(token_file)) as collector:
        url = collector.scrape.base_url + "/metrics"
        assert https_get(url, pki, f"Bearer {TOKEN}")[0] == 200
        time.sleep(0.01)
        with open(token_file, "w") as f:
            f.write("rotated\n")
        assert https_get(url, pki, "Bearer rotated")[0] == 200
        assert https_get(url, pki, f"Bearer {TOKEN}")[0] == 401


@pytest.mark.parametrize("flags, message", [
    (["--tls-cert-file", "{cert}"], "--tls-cert-file and --tls-key-file go together"),
    (["--tls-cert-file", "{cert}", "--tls-key-file", "{ca}"], "--tls-key-file"),
    (["--tls-client-ca-file", "{ca}"], "--tls-client-ca-file needs"),
    (["--auth", "bearer-token-file=/nonexistent"], "--auth: bearer token file /nonexistent"),
    (["--auth", "token=x"], "unknown authenticator 'token'"),
    (["--auth", "htpasswd-file={ca}"], "line 1: not user:password"),
])
def test_bad_tls_and_auth_flags_exit_2_naming_them(pki, flags, message, capsys) -> None:
    flags = [f.format(**pki) for f in flags]
    args = build_parser().parse_args(["collector", "--otlp-http-port", "0", "--otlp-grpc-port", "0",
                                      "--prometheus-port", "0", *flags])
    assert collector_cli.run(args) == 2
    assert message in capsys.readouterr().err


def test_print_otelcol_config_carries_tls_and_auth(pki, token_file, capsys) -> None:
    import yaml

    args = build_parser().parse_args(["collector", "--print-otelcol-config", "--tls-cert-file", pki["cert"],
                                      "--tls-key-file", pki["key"], "--auth", f"bearer-token-file={token_file}"])
    assert collector_cli.run(args) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["extensions"]["bearertokenauth/server"] == {"filename": token_file}
    assert config["receivers"]["otlp"]["protocols"]["http"]["tls"] == {"cert_file": pki["cert"], "key_file": pki["key"]}
    assert config["receivers"]["otlp"]["protocols"]["grpc"]["auth"] == {"authenticator": "bearertokenauth/server"}
