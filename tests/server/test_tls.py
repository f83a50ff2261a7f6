"""`otel-llm serve --tls-cert-file --tls-key-file [--tls-client-ca-file]`: HTTPS, and mutual TLS with a
client CA, with certificates from a throwaway CA made here (trustme). The `openai` client that trusts
the CA is served; one that does not fails verification; with mTLS a client without a certificate the
CA signed is refused. Bad files fail at startup, naming the flag."""

from __future__ import annotations

import ssl

import httpx
import openai
import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from otel_llm.cli.tls import TlsConfig, tls_config
from tests.server.api.api_server_harness import ServerProcess


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """Server and client certificates, each from its own CA, as PEM files."""
    d = tmp_path_factory.mktemp("pki")
    server_ca, client_ca = trustme.CA(), trustme.CA()
    server_cert = server_ca.issue_cert("127.0.0.1", "localhost")
    files = {"cert": d / "server.pem", "key": d / "server.key", "ca": d / "ca.pem", "client_ca": d / "client-ca.pem"}
    server_cert.cert_chain_pems[0].write_to_path(files["cert"])
    for pem in server_cert.cert_chain_pems[1:]:
        pem.write_to_path(files["cert"], append=True)
    server_cert.private_key_pem.write_to_path(files["key"])
    server_ca.cert_pem.write_to_path(files["ca"])
    client_ca.cert_pem.write_to_path(files["client_ca"])
    return files, client_ca


def _context(pki, client_cert: bool = False) -> ssl.SSLContext:
    files, client_ca = pki
    context = ssl.create_default_context(cafile=str(files["ca"]))
    if client_cert:
        client_ca.issue_cert("client@example.com").configure_cert(context)
    return context


def _openai(server: ServerProcess, verify) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30,
                         http_client=httpx.Client(verify=verify, timeout=30))


def _complete(client: openai.OpenAI) -> int:
    return client.completions.create(model="dummy", prompt="tls", max_tokens=3,
                                     extra_body={"ignore_eos": True}).usage.completion_tokens


@pytest.mark.slow
def test_https_with_the_ca_works_and_without_it_fails_verification(pki):
    files, _ = pki
    server = ServerProcess("--tls-cert-file", str(files["cert"]), "--tls-key-file", str(files["key"]),
                           tls=_context(pki)).start()
    try:
        assert server.url.startswith("https://")
        with _openai(server, _context(pki)) as client:
            assert _complete(client) == 3
        with _openai(server, True) as client, pytest.raises(openai.APIConnectionError) as raised:
            _complete(client)  # the system's CAs do not know this one
        assert "CERTIFICATE_VERIFY_FAILED" in repr(raised.value.__cause__)
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the HTTPS port is not served
            httpx.get(server.url.replace("https", "http") + "/health", timeout=5)
        assert f"serving dummy on https://127.0.0.1:{server.port}" in server.output()
    finally:
        server.stop()


@pytest.mark.slow
def test_mutual_tls_needs_a_client_certificate_from_the_client_ca(pki):
    files, _ = pki
    server = ServerProcess("--tls-cert-file", str(files["cert"]), "--tls-key-file", str(files["key"]),
                           "--tls-client-ca-file", str(files["client_ca"]),
                           tls=_context(pki, client_cert=True)).start()
    try:
        with _openai(server, _context(pki, client_cert=True)) as client:
            assert _complete(client) == 3
        with _openai(server, _context(pki)) as client, pytest.raises(openai.APIConnectionError):
            _complete(client)  # verifies the server, but has no certificate of its own
        stranger = ssl.create_default_context(cafile=str(files["ca"]))
        trustme.CA().issue_cert("stranger@example.com").configure_cert(stranger)
        with _openai(server, stranger) as client, pytest.raises(openai.APIConnectionError):
            _complete(client)  # a certificate, from a CA the server does not trust
    finally:
        server.stop()


def test_bad_tls_flags_fail_naming_the_flag(pki, tmp_path):
    files, _ = pki
    cert, key, ca = str(files["cert"]), str(files["key"]), str(files["ca"])
    assert tls_config(None, None, None) is None
    assert tls_config(cert, key, ca) == TlsConfig(cert, key, ca)
    assert TlsConfig(cert, key, ca).uvicorn_kwargs() == {"ssl_certfile": cert, "ssl_keyfile": key,
                                                         "ssl_ca_certs": ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    other_key = tmp_path / "other.key"
    trustme.CA().issue_cert("x").private_key_pem.write_to_path(other_key)
    encrypted_key = tmp_path / "encrypted.key"
    private_key = serialization.load_pem_private_key(files["key"].read_bytes(), None)
    encrypted_key.write_bytes(private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                        serialization.BestAvailableEncryption(b"pw")))
    for args, named in (((cert, None, None), "--tls-key-file"),
                        ((None, key, None), "--tls-cert-file"),
                        ((None, None, ca), "--tls-client-ca-file"),
                        ((str(tmp_path / "none.pem"), key, None), "--tls-cert-file"),
                        ((cert, key, str(tmp_path / "none.pem")), "--tls-client-ca-file"),
                        ((str(not_pem), key, None), "--tls-cert-file"),
                        ((cert, str(other_key), None), "--tls-key-file"),  # not this certificate's key
                        ((cert, str(encrypted_key), None), "--tls-key-file.*encrypted"),
                        ((cert, key, str(not_pem)), "--tls-client-ca-file")):
        with pytest.raises(ValueError, match=named):
            tls_config(*args)
