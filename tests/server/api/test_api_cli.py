"""`otel-llm serve` rejects bad flag values at startup, naming them, with exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from api_server_harness import REPO

from otel_llm.cli import build_parser
from otel_llm.server.cli import config_from_args
from otel_llm.server.config import ServerConfig
from otel_llm.server.engine import EngineConfig


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otel_llm", "serve", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args,named", [
    (["--port", "abc"], "abc"),
    (["--port", "70000"], "70000"),
    (["--max-num-seqs", "0"], "'0'"),
    (["--block-size", "-4"], "-4"),
    (["--metrics-compat", "prometheus"], "prometheus"),
    (["--dtype", "int8"], "int8"),
    (["--model", "/no/such/model/dir"], "--model '/no/such/model/dir'"),  # EngineConfig's error, in flag terms
    (["--log-stats-interval", "0"], "'0'"),
    (["--otlp-traces-endpoint", "localhost:4317"], "localhost:4317"),
    (["--served-model-name", " "], "' '"),
    (["--device", "tpu"], "--device 'tpu'"),
    (["--header-timeout", "0"], "'0'"),
    (["--body-timeout", "inf"], "--body-timeout inf: must be a finite number"),
    (["--api-key", ""], "--api-key (or $OTEL_LLM_API_KEY): must be printable ASCII"),
    (["--tls-key-file", "/no/key.pem"], "--tls-key-file needs --tls-cert-file"),
    (["--tls-cert-file", "/no/cert.pem", "--tls-key-file", "/no/key.pem"], "--tls-cert-file '/no/cert.pem': no such"),
    (["--slo-config", "/no/slo.yaml"], "cannot read the SLO file '/no/slo.yaml'"),
    (["--slo-config", str(REPO / "pyproject.toml")], "pyproject.toml: not YAML"),
])
def test_bad_flag_exits_2(args, named):
    r = _serve(*args)
    assert r.returncode == 2, r.stderr
    assert named in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args,named", [
    (["--max-model-len", "4096"], "max_model_len=4096"),  # beyond the dummy's 2048 positions: the engine says so
    (["--num-kv-blocks", "1"], "num_kv_blocks=1"),
    (["--device", "cuda"], "device='cuda'"),  # no GPU here: named at startup (skipped where CUDA exists)
])
def test_engine_rejected_value_exits_2(args, named):
    if "cuda" in args and _cuda_available():
        pytest.skip("CUDA is available here")
    r = _serve("--model", "dummy", "--port", "0", *args)
    assert r.returncode == 2, r.stderr
    assert named in r.stderr


def _cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def test_config_from_args_reads_otlp_env():
    args = build_parser().parse_args(["serve"])
    cfg = config_from_args(args, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert cfg.otlp_traces_endpoint == "http://collector:4318"
    cfg = config_from_args(build_parser().parse_args(["serve", "--otlp-traces-endpoint", "http://a:1/v1/traces"]),
                           environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert cfg.otlp_traces_endpoint == "http://a:1/v1/traces"
    assert config_from_args(args, environ={}).otlp_traces_endpoint is None


def test_config_from_args_puts_engine_flags_in_the_engine_config():
    args = build_parser().parse_args(["serve", "--max-num-seqs", "8", "--block-size", "32", "--dtype", "float32",
                                      "--disable-log-stats", "--engine-threads", "3", "--port", "9000", "--device", "cpu"])
    cfg = config_from_args(args, environ={})
    assert cfg.engine == EngineConfig(max_num_seqs=8, block_size=32, dtype="float32", log_stats=False, num_threads=3,
                                      device="cpu")
    assert cfg.port == 9000 and cfg.engine_threads == 3


def test_engine_threads_default_to_all_cores_but_one(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert ServerConfig().engine_threads == 7
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert ServerConfig().engine_threads == 1


def test_server_config_is_frozen_and_validated(tmp_path):
    cfg = ServerConfig()
    with pytest.raises(AttributeError):
        cfg.port = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="max-recv-per-iter 0"):
        ServerConfig(max_recv_per_iter=0)
    assert ServerConfig(served_model_name="x").model_name == "x"
    assert ServerConfig().model_name == "dummy"
    (tmp_path / "tiny-llama").mkdir()
    assert ServerConfig(engine=EngineConfig(model=f"{tmp_path}/tiny-llama/")).model_name == "tiny-llama"


def test_python_dash_m_server_help():
    r = subprocess.run([sys.executable, "-m", "otel_llm", "--help"], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "serve" in r.stdout and "demo" in r.stdout


def test_cardinality_limit_flag():
    assert config_from_args(build_parser().parse_args(["serve"])).cardinality_limit == 2000
    assert config_from_args(build_parser().parse_args(["serve", "--cardinality-limit", "50"])).cardinality_limit == 50
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--cardinality-limit", "0"])
    with pytest.raises(ValueError, match="--cardinality-limit 0"):
        ServerConfig(cardinality_limit=0)


def test_kv_cache_metrics_flags():
    def sample(*args):
        return config_from_args(build_parser().parse_args(["serve", *args])).engine.kv_cache_metrics_sample

    assert sample() == 0.0 and sample("--kv-cache-metrics-sample", "0.5") == 0.0  # off without --kv-cache-metrics
    assert sample("--kv-cache-metrics") == 0.01  # vLLM's default rate
    assert sample("--kv-cache-metrics", "--kv-cache-metrics-sample", "1") == 1.0
    with pytest.raises(ValueError, match="--kv-cache-metrics-sample 1.5"):
        sample("--kv-cache-metrics", "--kv-cache-metrics-sample", "1.5")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--kv-cache-metrics-sample", "0"])
    with pytest.raises(ValueError, match="kv_cache_metrics_sample=2"):
        EngineConfig(kv_cache_metrics_sample=2)


def test_null_step_flag_paces_only_the_null_model():
    def step_s(*args):
        return config_from_args(build_parser().parse_args(["serve", *args])).engine.null_step_s

    assert step_s("--model", "null") == 0.0
    assert step_s("--model", "null", "--null-step-ms", "8") == 0.008
    with pytest.raises(ValueError, match="--null-step-ms 8: needs --model null"):
        step_s("--model", "dummy", "--null-step-ms", "8")
    with pytest.raises(ValueError, match="--null-step-ms 70000"):
        step_s("--model", "null", "--null-step-ms", "70000")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--model", "null", "--null-step-ms", "0"])
    with pytest.raises(ValueError, match="null_step_s=0.01: only the null model"):
        EngineConfig(model="dummy", null_step_s=0.01)
    with pytest.raises(ValueError, match="null_step_s=-1"):
        EngineConfig(model="null", null_step_s=-1)
