"""The compatibility shim: per server dialect, a table from canonical instruments to exposed
Prometheus families. `profiles` picks one by name (`PROFILE_NAMES`, `get_profile`); `profile`
defines what a profile is; one file per dialect: `vllm`, `otel`, `sglang`, `tgi`, `triton`;
`prometheus_naming` is OTel's name translation, `custom_buckets` the operator's bounds.
"""
