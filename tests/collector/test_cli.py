"""`otel-llm collector` flags: the config they build, the printed otelcol config, and bad values."""

import subprocess
import sys

import pytest
import yaml

from otel_llm.cli import build_parser
from otel_llm.collector.cli import config_from_args
from otel_llm.collector.otelcol.config import otelcol_config
from otel_llm.collector.processor.tail_sampling import TailSamplingConfig
from otel_llm.collector.service import CollectorConfig
from otel_llm.shim.profiles import PROFILE_NAMES


def collector_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otel_llm", "collector", *argv], capture_output=True, text=True,
                          timeout=60)


def test_flags_build_the_collector_config():
    args = build_parser().parse_args(["collector", "--remote-write-url", "http://a:9090/api/v1/write",
                                      "--remote-write-url", "https://b/push", "--metric-expiry", "2m"])
    config = config_from_args(args)
    assert isinstance(config, CollectorConfig)
    assert config.host == "127.0.0.1"  # loopback unless asked
    assert config.remote_write_urls == ("http://a:9090/api/v1/write", "https://b/push")
    assert config.store.expiry_s == 120.0 and config.store.profile == "vllm"
    with pytest.raises(ValueError, match="'ftp://x'"):  # library users get the same check
        CollectorConfig(remote_write_urls=("ftp://x",))


def test_print_otelcol_config_uses_the_flags():
    done = collector_cli("--print-otelcol-config", "--metrics-compat", "otel", "--otlp-grpc-port", "14317",
                         "--remote-write-url", "http://prometheus:9090/api/v1/write",
                         "--otelcol-traces-endpoint", "jaeger:4317")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# OpenTelemetry Collector Contrib config for the otel-llm `otel` metric names")
    config = yaml.safe_load(done.stdout)
    assert config == otelcol_config("otel", otlp_grpc_endpoint="0.0.0.0:14317",
                                    remote_write_urls=["http://prometheus:9090/api/v1/write"],
                                    traces_endpoint="jaeger:4317")
    assert config["exporters"]["prometheusremotewrite/0"]["endpoint"] == "http://prometheus:9090/api/v1/write"
    assert config["service"]["pipelines"]["traces"]["exporters"] == ["otlp/traces"]


def test_print_otelcol_config_honours_an_explicit_host():
    done = collector_cli("--print-otelcol-config", "--host", "10.1.2.3")
    config = yaml.safe_load(done.stdout)
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "10.1.2.3:4318"
    assert config["exporters"]["prometheus"]["endpoint"] == "10.1.2.3:9464"
    assert "traces" not in config["service"]["pipelines"]


def test_print_otelcol_config_carries_the_trace_flags():
    done = collector_cli("--print-otelcol-config", "--traces-to", "grpc://jaeger:4317", "--traces-to",
                         "http://tempo:4318", "--storage-dir", "/var/lib/otelcol/q", "--tail-sampling",
                         "--keep-ttft-above", "500ms", "--keep-e2e-above", "off", "--keep-fraction", "0.25",
                         "--decision-wait", "3s")
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    sampling = TailSamplingConfig(decision_wait_s=3.0, ttft_above_s=0.5, e2e_above_s=None, keep_fraction=0.25)
    assert config == otelcol_config("vllm", traces_to=("grpc://jaeger:4317", "http://tempo:4318"),
                                    storage_dir="/var/lib/otelcol/q", tail_sampling=sampling)
    traces = config["service"]["pipelines"]["traces"]
    assert traces["processors"] == ["memory_limiter", "tail_sampling", "batch"]
    assert traces["exporters"] == ["otlp/0", "otlphttp/1"]
    assert config["exporters"]["otlphttp/1"]["traces_endpoint"] == "http://tempo:4318/v1/traces"
    assert config["processors"]["tail_sampling"]["decision_wait"] == "3s"
    assert "Traces:" in done.stdout.split("\nreceivers:")[0]


def test_metrics_to_forwards_canonical_metrics_and_is_in_the_printed_config():
    args = build_parser().parse_args(["collector", "--metrics-to", "grpc://mimir:4317", "--metrics-to", "http://m:4318"])
    config = config_from_args(args)
    assert config.metrics_to == ("grpc://mimir:4317", "http://m:4318")
    assert [(c.name, c.endpoint, c.signal) for c in config.metric_exporter_configs()] == [
        ("otlp/metrics/0", "mimir:4317", "metrics"), ("otlphttp/metrics/1", "http://m:4318/v1/metrics", "metrics")]
    done = collector_cli("--print-otelcol-config", "--metrics-to", "grpc://mimir:4317", "--metrics-to", "http://m:4318")
    assert done.returncode == 0, done.stderr
    printed = yaml.safe_load(done.stdout)
    assert printed["service"]["pipelines"]["metrics/otlp"] == {
        "receivers": ["otlp"], "processors": ["memory_limiter", "batch"],
        "exporters": ["otlp/metrics/0", "otlphttp/metrics/1"]}  # canonical names: no renames on this pipeline
    assert printed["exporters"]["otlphttp/metrics/1"] == {"metrics_endpoint": "http://m:4318/v1/metrics"}
    bad = collector_cli("--metrics-to", "ftp://x")
    assert bad.returncode == 2 and "--metrics-to" in bad.stderr


def test_print_otelcol_config_trace_flags_need_an_exporter():
    for flags in (("--tail-sampling",), ("--storage-dir", "/q")):
        done = collector_cli("--print-otelcol-config", *flags)
        assert done.returncode == 2 and done.stdout == ""
        assert f"error: {flags[0]} needs a trace exporter in the printed config: add --traces-to" in done.stderr
    done = collector_cli("--print-otelcol-config", "--traces-to", "grpc://j:4317", "--trace-store", "/tmp/t")
    assert done.returncode == 2 and "--trace-store keeps traces on this host" in done.stderr
    done = collector_cli("--print-otelcol-config", "--traces-to", "jaeger:4317")
    assert done.returncode == 2 and "invalid trace backend 'jaeger:4317'" in done.stderr
    done = collector_cli("--print-otelcol-config", "--otelcol-traces-endpoint", "jaeger:4317", "--tail-sampling")
    assert done.returncode == 0 and "tail_sampling" in yaml.safe_load(done.stdout)["processors"]


def test_bad_values_exit_2_naming_them():
    for mode in ((), ("--print-otelcol-config",)):
        done = collector_cli(*mode, "--remote-write-url", "prometheus:9090")
        assert done.returncode == 2 and done.stdout == ""
        assert "argument --remote-write-url: invalid URL 'prometheus:9090'" in done.stderr
    done = collector_cli("--otelcol-traces-endpoint", "jaeger:4317")
    assert done.returncode == 2 and "only applies with --print-otelcol-config" in done.stderr
    done = collector_cli("--metric-expiry", "soon")
    assert done.returncode == 2 and "invalid duration 'soon'" in done.stderr


def test_tail_sampling_and_storage_flags():
    args = build_parser().parse_args(["collector", "--traces-to", "grpc://jaeger:4317", "--tail-sampling",
                                      "--keep-ttft-above", "500ms", "--keep-e2e-above", "off",
                                      "--keep-fraction", "0.25", "--decision-wait", "3s", "--storage-dir", "/tmp/q"])
    config = config_from_args(args)
    assert config.traces_to == ("grpc://jaeger:4317",) and config.storage_dir == "/tmp/q"
    sampling = config.tail_sampling
    assert (sampling.ttft_above_s, sampling.e2e_above_s, sampling.queue_above_s) == (0.5, None, 5.0)
    assert (sampling.keep_fraction, sampling.decision_wait_s) == (0.25, 3.0)
    default = config_from_args(build_parser().parse_args(["collector"]))
    assert default.tail_sampling is None and default.phase_spans is True
    assert config_from_args(build_parser().parse_args(["collector", "--no-phase-spans"])).phase_spans is False
    store = config_from_args(build_parser().parse_args(
        ["collector", "--trace-store", "/tmp/t", "--trace-retention", "2h", "--trace-store-max-mib", "64"])).trace_store
    assert (store.directory, store.retention_s, store.max_bytes) == ("/tmp/t", 7200.0, 64 * 1024 * 1024)


def test_trace_flags_need_a_backend_and_valid_values():
    for flags in (("--tail-sampling",), ("--storage-dir", "/tmp/q")):
        done = collector_cli(*flags)
        assert done.returncode == 2 and "add --traces-to URL" in done.stderr
    done = collector_cli("--trace-store", "/proc/no-such-dir/x", "--jaeger-port", "0")
    assert done.returncode == 1 and "cannot open --storage-dir / --trace-store" in done.stderr
    done = collector_cli("--traces-to", "jaeger:4317")
    assert done.returncode == 2 and "invalid trace backend 'jaeger:4317'" in done.stderr
    done = collector_cli("--traces-to", "grpc://j:1", "--keep-fraction", "2")
    assert done.returncode == 2 and "invalid fraction '2'" in done.stderr


def test_metrics_compat_takes_every_profile_and_names_the_choices_otherwise():
    for name in PROFILE_NAMES:
        args = build_parser().parse_args(["collector", "--metrics-compat", name])
        assert config_from_args(args).store.profile == name
    done = collector_cli("--metrics-compat", "sglang-nope")
    assert done.returncode == 2 and done.stdout == ""
    assert "argument --metrics-compat: invalid choice: 'sglang-nope' (choose from" in done.stderr
    assert all(name in done.stderr.rsplit("choose from", 1)[1] for name in PROFILE_NAMES)


def test_print_otelcol_config_refuses_the_profiles_it_cannot_express():
    done = collector_cli("--print-otelcol-config", "--metrics-compat", "triton")
    assert done.returncode == 2 and done.stdout == ""
    assert "error: profile 'triton': the otelcol-contrib config supports vllm and otel only" in done.stderr
    assert "`otel-llm collector --metrics-compat triton` serves them" in done.stderr
